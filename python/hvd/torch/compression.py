"""Gradient compression for allreduce: none, or float16 on the wire."""

import torch


class Compressor(object):
    """Turns a tensor into what travels (compress) and back (decompress)."""

    @staticmethod
    def compress(tensor):
        """Returns the tensor to send and a context for decompress."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16, halving their bytes; other
    tensors go as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None else tensor


class Compression(object):
    """The compressors DistributedOptimizer and allreduce accept."""
    none = NoneCompressor
    fp16 = FP16Compressor
