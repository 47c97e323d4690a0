"""Argument checks shared by the stages: one meaning of "an int" (a bool is not one, though Python says it is)."""


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
