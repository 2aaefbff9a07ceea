"""The exceptions Horovod's API raises, under the names its users catch."""


class HorovodInternalError(RuntimeError):
    """An operation failed in hvd (a peer failed or disagreed, the job shut
    down). Elastic jobs recover from it: state is restored and the workers
    meet again."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added to or removed from an elastic job: the workers reset
    at the same commit. skip_sync is True when hosts were only removed, so
    that the survivors' state needs no broadcast."""

    def __init__(self, skip_sync):
        super().__init__('hosts were added to or removed from the elastic job')
        self.skip_sync = skip_sync
