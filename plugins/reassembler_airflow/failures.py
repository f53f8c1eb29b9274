"""How the core's errors fail an Airflow task (reassembler/errors.py has the codes).

Bad input and failed audit checks cannot pass on a retry: they fail the task at once
(AirflowFailException). A busy output or warehouse and exhausted resources may pass later:
they raise normally, so the task's retries apply. The message is the core's one line.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def task_errors():
    from airflow.sdk.exceptions import AirflowFailException

    from reassembler.errors import AuditCheckFailed, InputError, classify

    try:
        yield
    except Exception as e:
        known = classify(e)
        if isinstance(known, (InputError, AuditCheckFailed)):
            raise AirflowFailException(str(known)) from e
        if known is not None and known is not e:
            raise known from e
        raise
