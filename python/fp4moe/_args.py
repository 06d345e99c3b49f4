"""Scalar arguments on their way to C: the one place they are checked.

ctypes converts a Python int to a C int by keeping its low 32 bits and a float
by truncating it, and a str to char* stops at the first NUL: 2**32 + 4 experts
would run as 4, layer 2**32 would load layer 0, 4.7 would become 4, and
"a.safetensors\\0b" would open "a.safetensors". Every scalar the package hands
to the library goes through one of these, which refuse such values and name
the argument (TypeError for the wrong kind of value, ValueError for a value out
of range), before anything is called.
"""

import numbers
import os

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # C int on every platform the library builds for (LP64, LLP64)
UINTPTR_MAX = 2**64 - 1


def as_int(value, arg, lo=INT_MIN, hi=INT_MAX):
    """value as a Python int in [lo, hi] (default: C int's range). Accepted: int and
    numpy integers; refused: bool (True as a count is a bug, not 1), floats (4.7 is
    not 4, and 4.0 is refused too rather than guessed at), str, anything else."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{arg}: expected an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if not lo <= v <= hi:
        raise ValueError(f"{arg}: {v} is outside [{lo}, {hi}]")
    return v


def as_float(value, arg):
    """value as a Python float: int, float or numpy real (bool refused). Range and
    finiteness are the library's to judge (it names the field)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{arg}: expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def as_choice(value, arg, choices):
    """value, one of choices (a dict or sequence of str), or a ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{arg}: expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def as_cstr(value, arg):
    """A str as NUL-terminated bytes (UTF-8); one with a NUL inside is refused, since C
    would read it cut there."""
    if not isinstance(value, str):
        raise TypeError(f"{arg}: expected a str, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{arg}: contains a NUL character (C would read {value.split(chr(0))[0]!r})")
    return value.encode()


def as_path(value, arg):
    """(str path, bytes for C) from a str or os.PathLike; a NUL inside is refused."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{arg}: expected a str or os.PathLike, got {type(value).__name__}")
    p = os.fspath(value)
    if not isinstance(p, str):
        raise TypeError(f"{arg}: expected a str path, got {type(p).__name__}")
    if "\0" in p:
        raise ValueError(f"{arg}: contains a NUL character (C would open {p.split(chr(0))[0]!r})")
    return p, os.fsencode(p)
