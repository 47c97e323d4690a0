"""The article's claims, measured: one module per article section, each with `claims(...) -> list[Claim]`.

Every notebook closes with its section's table; notebook 09 shows them all. Nothing here is typed in:
each function computes what it reports from the tokenizer, the model or its config.
"""
