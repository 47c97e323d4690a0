import torch

import llmwalk as lw


def test_journey_times_every_stage_and_answers(smollm2):
    j = lw.journey(smollm2, "The capital of France is", max_new_tokens=6)
    assert j.ids == smollm2.tokenizer.encode("The capital of France is")
    assert smollm2.tokenizer.decode([j.first_token]) == " Paris"
    assert j.answer.new_ids[0] == j.first_token                      # the loop starts where the walk ended
    torch.testing.assert_close(j.probs, j.trace.logits[-1].softmax(-1))
    assert [s[0] for s in j.stages()] == ["tokenize", "embedding", "30 × (attention + FFN)", "final norm",
                                          "LM head", "softmax", "pick a token"]
    assert j.stages()[1][1] == "[5] → [5, 576]" and j.stages()[4][1] == "[576] → [49152] logits"
    assert all(s[2] >= 0 for s in j.stages()) and len([k for k in j.seconds if k.startswith("layer ")]) == 30
