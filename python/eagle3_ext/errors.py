"""The errors the library raises for bad input: a value, file or model the caller gave that is
wrong, as opposed to a fault of the library itself (or of the machine).

``BadInput`` is the one type to catch for "the input was wrong". Nothing raises it directly:
each fault raises the subclass that is also the built-in exception the API has always raised
for it, so ``except ValueError`` / ``except TypeError`` / ``except FileNotFoundError`` keep
catching exactly what they caught before (a wrong type is not a ValueError, a missing file not
a ValueError):

=========================  ===============================================  =====================
class                      raised for                                       also a
=========================  ===============================================  =====================
``BadInputError``          a value out of range; a file, model directory    ``ValueError``
                           or data with the wrong content; a mismatched
                           target and draft; options that conflict
``BadInputTypeError``      a value of the wrong type                        ``TypeError``
``MissingPathError``       a path the caller named does not exist, or       ``FileNotFoundError``
                           something the caller asked for is not installed
``PathExistsError``        a path the caller named for a new output         ``FileExistsError``
                           exists already
``UnreadablePathError``    a path the caller named cannot be read           ``PermissionError``
=========================  ===============================================  =====================

The ``eagle3`` command reports a ``BadInput`` as one line and exit code 2; any other exception
is a fault of the library or the machine, reported with its traceback and exit code 1, so a
plain ValueError, TypeError or OSError raised inside the library (a bug, a full disk) is never
passed off as bad input.
"""

from __future__ import annotations


class BadInput(Exception):
    """Base of the bad-input errors: what the caller gave is wrong, and the message names it and
    says what was expected."""


class BadInputError(BadInput, ValueError):
    """A value, file or model the caller gave is wrong (out of range, wrong content, mismatched)."""


class BadInputTypeError(BadInput, TypeError):
    """A value the caller gave has the wrong type."""


class MissingPathError(BadInput, FileNotFoundError):
    """A path the caller named does not exist (or a package it asked for is not installed)."""


class PathExistsError(BadInput, FileExistsError):
    """A path the caller named as a new output exists already."""


class UnreadablePathError(BadInput, PermissionError):
    """A path the caller named cannot be read."""


__all__ = ["BadInput", "BadInputError", "BadInputTypeError", "MissingPathError", "PathExistsError",
           "UnreadablePathError"]
