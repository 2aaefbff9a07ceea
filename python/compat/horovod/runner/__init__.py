"""horovod.runner: Horovod's launcher API, which hvd does not provide;
hvd's jobs start with the hvdrun command."""

__all__ = ['run']


def run(*args, **kwargs):
    """Horovod starts a job from Python with horovod.run(func, np=..., ...);
    with hvd, start the script with hvdrun and call the function in it."""
    raise NotImplementedError(
        'horovod.run is not available with hvd: start the job with hvdrun instead, e.g. '
        '`hvdrun -np 4 --horovod-compat python3 train.py`, and call the training function '
        'directly in the script')
