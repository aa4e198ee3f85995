"""The one rule a batch id follows, checked where the batch is declared.

A batch id travels where a worker reads it back, and an id that one of them cannot carry
makes a batch that never ends: its callback's payload (the ``batch_id`` field, an
:data:`~conventions.jobs.payloads.Id`: the callback would be refused at every sweep) and
each member's ``cc_batch`` header (the ids of its batch and of every batch around it,
innermost first, comma-separated: a worker reads 1 to ``hdr.MAX_KEY`` characters and
ignores a longer one). So ``app.batch()`` and :meth:`Batch.batch` refuse, with
:class:`~conventions.errors.ConfigurationError`:

* an id that is not an ``Id``: 1 to 128 letters, digits, ``_``, ``.``, ``:`` or ``-``
  (so no ``,`` nor ``|``, the separators of the header and of a due callback);
* a nested id whose ``cc_batch`` header, with the ids of the batches around it, would be
  longer than ``hdr.MAX_KEY`` characters;
* a nested id equal to the id of a batch around it (one id would name two batches).
"""

from __future__ import annotations

from typing import Final

from pydantic import TypeAdapter, ValidationError

from conventions.errors import ConfigurationError
from conventions.jobs.payloads import Id
from conventions.tracing import headers as hdr

#: the rule of the callbacks' ``batch_id`` field, applied to the id itself
_ID: Final = TypeAdapter(Id)
#: the rule in words, for the errors
RULE: Final = "1 to 128 letters, digits, '_', '.', ':' or '-' (an Id, as a callback's batch_id)"


def checked(batch_id: object, around: tuple[str, ...] = ()) -> str:
    """``batch_id`` when a batch nested in the batches ``around`` (innermost first; none
    for an outermost batch) may take it, else ConfigurationError naming the id and the
    rule it breaks."""
    if not isinstance(batch_id, str):
        raise ConfigurationError(f"batch id {batch_id!r}: a string of {RULE}")
    try:
        _ID.validate_python(batch_id)
    except ValidationError:
        raise ConfigurationError(f"batch id {batch_id!r}: {RULE}") from None
    if batch_id in around:
        raise ConfigurationError(
            f"batch id {batch_id!r} is the id of a batch it is nested in "
            f"({' in '.join(around)}): a nested batch takes an id of its own"
        )
    header = ",".join((batch_id, *around))
    if len(header) > hdr.MAX_KEY:
        raise ConfigurationError(
            f"batch id {batch_id!r}: with the ids of the batches around it, its members' "
            f"{hdr.BATCH} header would be {len(header)} characters, over the {hdr.MAX_KEY} "
            "a worker reads: shorter ids, or fewer levels of nesting"
        )
    return batch_id
