"""The article's claims, measured: one module per article section, each with `claims(...) -> list[Claim]`.

A claim row holds the article's words (and its number, `said`), what we measured (`numbers`, and the prose formatted
from them) and a verdict from the one rule set, `llmwalk.report.Verdict`. The measurements themselves live in
`llmwalk.analysis` (and the stage modules): nothing here is typed in, and nothing here is a second analysis library.
Every notebook closes with its section's table; notebook 09 shows them all, one table per section.
"""
