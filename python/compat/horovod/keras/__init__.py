"""horovod.keras is not provided by hvd: importing it raises ImportError."""

from horovod._not_provided import refuse

refuse(__name__)
