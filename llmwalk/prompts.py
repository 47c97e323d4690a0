"""The series' running examples, defined once: the prompts every notebook section, claim, widget and benchmark walks
through the model. Data, not code: change a prompt here and every place that shows or measures it follows."""

PROMPT = "The capital of France is"              # the English completion the series walks, stage by stage
ANSWER = " Paris"                                # ... the token it should continue with (one token, space included)
QUESTION = "法国的首都是什么"                      # the article's question, as printed ("What is the capital of France")
ENGLISH_QUESTION = "What is the capital of France?"   # the same question in English (SmolLM2 answers it and stops)
GEMMA_QUESTION = QUESTION + "？\n"                # Gemma-3-270M is a base model: the question, its mark and a line break

# Speculative decoding's prompts, (text, chat): answers that copy their prompt (a sentence to repeat, code to edit),
# and one with nothing to copy.
SPECULATIVE_PROMPTS = {
    "repeat": ("Repeat this sentence exactly: The old lighthouse keeper climbed the narrow stairs every evening, "
               "lit the great lamp, and watched the ships pass safely through the dark and stormy channel.", True),
    "edit code": ("Add type hints to this function:\n\ndef scale(values, factor):\n"
                  "    return [v * factor for v in values]\n", True),
    "no copy": ("The history of the printing press", False),
}
