/*
 * The 161 parameter tensors of torchvision's ResNet-50 (torchvision.models.resnet50(),
 * weights=None, 1000 classes), in model.named_parameters() order: the stem
 * conv1 7x7 and bn1, then layer1-layer4 of 3, 4, 6 and 3 Bottleneck blocks
 * (1x1, 3x3, 1x1 convolutions without bias, each followed by a BatchNorm
 * with weight and bias; the first block of each layer adds a 1x1
 * downsample convolution and its BatchNorm), then fc (2048 -> 1000, with
 * bias). Shapes are PyTorch's (out, in, kh, kw). They sum to 25,557,032
 * values, the figure torchvision documents for resnet50 ("num_params":
 * 25557032). One gradient tensor per parameter is what Horovod's
 * DistributedOptimizer allreduces each step.
 *
 * Shared by hvd-bench-grads (bench/hvd_grad_bench.c) and the MPI peer
 * (bench/peers/mpi_grads.c), so both move exactly the same tensors.
 */
#ifndef HVD_BENCH_RESNET50_PARAMS_H
#define HVD_BENCH_RESNET50_PARAMS_H

#include <stdint.h>

#define RESNET50_TENSORS 161
#define RESNET50_VALUES 25557032 /* float32 values over all tensors */

struct resnet50_param {
  const char *name; /* torchvision's parameter name */
  int ndims;
  int64_t shape[4];
};

static const struct resnet50_param resnet50_params[RESNET50_TENSORS] = {
    {"conv1.weight", 4, {64, 3, 7, 7}},
    {"bn1.weight", 1, {64}},
    {"bn1.bias", 1, {64}},
    {"layer1.0.conv1.weight", 4, {64, 64, 1, 1}},
    {"layer1.0.bn1.weight", 1, {64}},
    {"layer1.0.bn1.bias", 1, {64}},
    {"layer1.0.conv2.weight", 4, {64, 64, 3, 3}},
    {"layer1.0.bn2.weight", 1, {64}},
    {"layer1.0.bn2.bias", 1, {64}},
    {"layer1.0.conv3.weight", 4, {256, 64, 1, 1}},
    {"layer1.0.bn3.weight", 1, {256}},
    {"layer1.0.bn3.bias", 1, {256}},
    {"layer1.0.downsample.0.weight", 4, {256, 64, 1, 1}},
    {"layer1.0.downsample.1.weight", 1, {256}},
    {"layer1.0.downsample.1.bias", 1, {256}},
    {"layer1.1.conv1.weight", 4, {64, 256, 1, 1}},
    {"layer1.1.bn1.weight", 1, {64}},
    {"layer1.1.bn1.bias", 1, {64}},
    {"layer1.1.conv2.weight", 4, {64, 64, 3, 3}},
    {"layer1.1.bn2.weight", 1, {64}},
    {"layer1.1.bn2.bias", 1, {64}},
    {"layer1.1.conv3.weight", 4, {256, 64, 1, 1}},
    {"layer1.1.bn3.weight", 1, {256}},
    {"layer1.1.bn3.bias", 1, {256}},
    {"layer1.2.conv1.weight", 4, {64, 256, 1, 1}},
    {"layer1.2.bn1.weight", 1, {64}},
    {"layer1.2.bn1.bias", 1, {64}},
    {"layer1.2.conv2.weight", 4, {64, 64, 3, 3}},
    {"layer1.2.bn2.weight", 1, {64}},
    {"layer1.2.bn2.bias", 1, {64}},
    {"layer1.2.conv3.weight", 4, {256, 64, 1, 1}},
    {"layer1.2.bn3.weight", 1, {256}},
    {"layer1.2.bn3.bias", 1, {256}},
    {"layer2.0.conv1.weight", 4, {128, 256, 1, 1}},
    {"layer2.0.bn1.weight", 1, {128}},
    {"layer2.0.bn1.bias", 1, {128}},
    {"layer2.0.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.0.bn2.weight", 1, {128}},
    {"layer2.0.bn2.bias", 1, {128}},
    {"layer2.0.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.0.bn3.weight", 1, {512}},
    {"layer2.0.bn3.bias", 1, {512}},
    {"layer2.0.downsample.0.weight", 4, {512, 256, 1, 1}},
    {"layer2.0.downsample.1.weight", 1, {512}},
    {"layer2.0.downsample.1.bias", 1, {512}},
    {"layer2.1.conv1.weight", 4, {128, 512, 1, 1}},
    {"layer2.1.bn1.weight", 1, {128}},
    {"layer2.1.bn1.bias", 1, {128}},
    {"layer2.1.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.1.bn2.weight", 1, {128}},
    {"layer2.1.bn2.bias", 1, {128}},
    {"layer2.1.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.1.bn3.weight", 1, {512}},
    {"layer2.1.bn3.bias", 1, {512}},
    {"layer2.2.conv1.weight", 4, {128, 512, 1, 1}},
    {"layer2.2.bn1.weight", 1, {128}},
    {"layer2.2.bn1.bias", 1, {128}},
    {"layer2.2.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.2.bn2.weight", 1, {128}},
    {"layer2.2.bn2.bias", 1, {128}},
    {"layer2.2.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.2.bn3.weight", 1, {512}},
    {"layer2.2.bn3.bias", 1, {512}},
    {"layer2.3.conv1.weight", 4, {128, 512, 1, 1}},
    {"layer2.3.bn1.weight", 1, {128}},
    {"layer2.3.bn1.bias", 1, {128}},
    {"layer2.3.conv2.weight", 4, {128, 128, 3, 3}},
    {"layer2.3.bn2.weight", 1, {128}},
    {"layer2.3.bn2.bias", 1, {128}},
    {"layer2.3.conv3.weight", 4, {512, 128, 1, 1}},
    {"layer2.3.bn3.weight", 1, {512}},
    {"layer2.3.bn3.bias", 1, {512}},
    {"layer3.0.conv1.weight", 4, {256, 512, 1, 1}},
    {"layer3.0.bn1.weight", 1, {256}},
    {"layer3.0.bn1.bias", 1, {256}},
    {"layer3.0.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.0.bn2.weight", 1, {256}},
    {"layer3.0.bn2.bias", 1, {256}},
    {"layer3.0.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.0.bn3.weight", 1, {1024}},
    {"layer3.0.bn3.bias", 1, {1024}},
    {"layer3.0.downsample.0.weight", 4, {1024, 512, 1, 1}},
    {"layer3.0.downsample.1.weight", 1, {1024}},
    {"layer3.0.downsample.1.bias", 1, {1024}},
    {"layer3.1.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.1.bn1.weight", 1, {256}},
    {"layer3.1.bn1.bias", 1, {256}},
    {"layer3.1.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.1.bn2.weight", 1, {256}},
    {"layer3.1.bn2.bias", 1, {256}},
    {"layer3.1.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.1.bn3.weight", 1, {1024}},
    {"layer3.1.bn3.bias", 1, {1024}},
    {"layer3.2.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.2.bn1.weight", 1, {256}},
    {"layer3.2.bn1.bias", 1, {256}},
    {"layer3.2.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.2.bn2.weight", 1, {256}},
    {"layer3.2.bn2.bias", 1, {256}},
    {"layer3.2.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.2.bn3.weight", 1, {1024}},
    {"layer3.2.bn3.bias", 1, {1024}},
    {"layer3.3.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.3.bn1.weight", 1, {256}},
    {"layer3.3.bn1.bias", 1, {256}},
    {"layer3.3.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.3.bn2.weight", 1, {256}},
    {"layer3.3.bn2.bias", 1, {256}},
    {"layer3.3.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.3.bn3.weight", 1, {1024}},
    {"layer3.3.bn3.bias", 1, {1024}},
    {"layer3.4.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.4.bn1.weight", 1, {256}},
    {"layer3.4.bn1.bias", 1, {256}},
    {"layer3.4.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.4.bn2.weight", 1, {256}},
    {"layer3.4.bn2.bias", 1, {256}},
    {"layer3.4.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.4.bn3.weight", 1, {1024}},
    {"layer3.4.bn3.bias", 1, {1024}},
    {"layer3.5.conv1.weight", 4, {256, 1024, 1, 1}},
    {"layer3.5.bn1.weight", 1, {256}},
    {"layer3.5.bn1.bias", 1, {256}},
    {"layer3.5.conv2.weight", 4, {256, 256, 3, 3}},
    {"layer3.5.bn2.weight", 1, {256}},
    {"layer3.5.bn2.bias", 1, {256}},
    {"layer3.5.conv3.weight", 4, {1024, 256, 1, 1}},
    {"layer3.5.bn3.weight", 1, {1024}},
    {"layer3.5.bn3.bias", 1, {1024}},
    {"layer4.0.conv1.weight", 4, {512, 1024, 1, 1}},
    {"layer4.0.bn1.weight", 1, {512}},
    {"layer4.0.bn1.bias", 1, {512}},
    {"layer4.0.conv2.weight", 4, {512, 512, 3, 3}},
    {"layer4.0.bn2.weight", 1, {512}},
    {"layer4.0.bn2.bias", 1, {512}},
    {"layer4.0.conv3.weight", 4, {2048, 512, 1, 1}},
    {"layer4.0.bn3.weight", 1, {2048}},
    {"layer4.0.bn3.bias", 1, {2048}},
    {"layer4.0.downsample.0.weight", 4, {2048, 1024, 1, 1}},
    {"layer4.0.downsample.1.weight", 1, {2048}},
    {"layer4.0.downsample.1.bias", 1, {2048}},
    {"layer4.1.conv1.weight", 4, {512, 2048, 1, 1}},
    {"layer4.1.bn1.weight", 1, {512}},
    {"layer4.1.bn1.bias", 1, {512}},
    {"layer4.1.conv2.weight", 4, {512, 512, 3, 3}},
    {"layer4.1.bn2.weight", 1, {512}},
    {"layer4.1.bn2.bias", 1, {512}},
    {"layer4.1.conv3.weight", 4, {2048, 512, 1, 1}},
    {"layer4.1.bn3.weight", 1, {2048}},
    {"layer4.1.bn3.bias", 1, {2048}},
    {"layer4.2.conv1.weight", 4, {512, 2048, 1, 1}},
    {"layer4.2.bn1.weight", 1, {512}},
    {"layer4.2.bn1.bias", 1, {512}},
    {"layer4.2.conv2.weight", 4, {512, 512, 3, 3}},
    {"layer4.2.bn2.weight", 1, {512}},
    {"layer4.2.bn2.bias", 1, {512}},
    {"layer4.2.conv3.weight", 4, {2048, 512, 1, 1}},
    {"layer4.2.bn3.weight", 1, {2048}},
    {"layer4.2.bn3.bias", 1, {2048}},
    {"fc.weight", 2, {1000, 2048}},
    {"fc.bias", 1, {1000}},
};

/* Elements of tensor i. */
static inline int64_t resnet50_count(int i) {
  int64_t n = 1;
  for (int d = 0; d < resnet50_params[i].ndims; d++)
    n *= resnet50_params[i].shape[d];
  return n;
}

#endif /* HVD_BENCH_RESNET50_PARAMS_H */
