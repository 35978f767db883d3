"""What the dataplane requires of a model's scheduler; the default scheduler, the dynamic and
sequence batchers and the ensemble scheduler each provide it."""

from typing import Any, Protocol


class Scheduler(Protocol):
    async def submit(self, work: Any, batch_size: int = 1, priority: int = 0,
                     timeout_us: int = 0) -> Any:
        """Run `work` (a WorkRequest) once it has its turn; returns (WorkResponse,
        BatchTimings, queue ns). A decoupled model's responses also go out on the work's
        ResponseStream. QueueRejection when its queue refuses it."""
        ...

    def default_bound_applies(self, work: Any) -> bool:
        """Whether --max-queue-size-default bounds this request's queue (no queue policy of
        the model's own bounds it)."""
        ...

    def close(self) -> None:
        """Stop: fail what is queued, start nothing more."""
        ...
