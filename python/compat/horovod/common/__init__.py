"""horovod.common: the exceptions Horovod's framework modules share
(horovod.common.exceptions), which are hvd's."""
