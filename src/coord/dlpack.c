/*
 * Outputs handed to a framework as DLPack tensors (hvd_output_dlpack).
 *
 * DESIGN. A framework adopts foreign memory through DLPack's
 * DLManagedTensor: the structure says where the bytes are and carries the
 * deleter the framework calls once its last tensor over them is freed.
 * That call comes on whatever thread frees the tensor, possibly while the
 * thread's interpreter unwinds an exception or finalizes, where code of
 * the binding's language cannot run safely (a Python deleter turned torch's
 * RuntimeError into a SystemError). So the deleter is C and
 * self-contained: it frees the output as hvd_output_free or
 * hvd_output_free_gpu would, then the structure and its shape, allocated
 * together in one block. The structures are declared here rather than
 * included: dlpack.h's 0.x layout is small and frozen, and hvd needs
 * nothing else of it.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "coord.h"

/* dlpack.h 0.x: DLDevice, DLDataType, DLTensor, DLManagedTensor. */
enum { KDL_CPU = 1, KDL_CUDA = 2, KDL_UINT = 1 };

struct dl_device {
  int32_t device_type; /* DLDeviceType, an int-sized enum */
  int32_t device_id;
};

struct dl_data_type {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct dl_tensor {
  void *data;
  struct dl_device device;
  int32_t ndim;
  struct dl_data_type dtype;
  int64_t *shape;
  int64_t *strides; /* NULL: compact, row-major */
  uint64_t byte_offset;
};

struct dl_managed_tensor {
  struct dl_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct dl_managed_tensor *self);
};

/* What hvd_output_dlpack allocates: the structure and its one dimension. */
struct dlpack_block {
  struct dl_managed_tensor managed;
  int64_t shape[1];
};

static atomic_size_t live;

static void dlpack_deleter_cb(struct dl_managed_tensor *self) {
  struct dlpack_block *block = (struct dlpack_block *)self;

  if (block == NULL)
    return;
  if (block->managed.dl_tensor.device.device_type == KDL_CPU)
    hvd_output_free(block->managed.dl_tensor.data);
  else
    hvd_output_free_gpu(block->managed.dl_tensor.data);
  free(block);
  atomic_fetch_sub(&live, 1);
}

HVD_API hvd_status hvd_output_dlpack(void *data, size_t bytes, int device, void **managed) {
  struct dlpack_block *block;

  if (data == NULL || managed == NULL || device < HVD_DEVICE_CPU)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "hvd_output_dlpack: data and managed must not be NULL, and device must be "
                     "HVD_DEVICE_CPU or a GPU's ordinal (got %d)",
                     device);
  block = hvd_zalloc(1, sizeof(*block));
  if (block == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "hvd_output_dlpack: cannot allocate a DLManagedTensor");
  block->shape[0] = (int64_t)bytes;
  block->managed.dl_tensor.data = data;
  block->managed.dl_tensor.device.device_type = device == HVD_DEVICE_CPU ? KDL_CPU : KDL_CUDA;
  block->managed.dl_tensor.device.device_id = device == HVD_DEVICE_CPU ? 0 : device;
  block->managed.dl_tensor.ndim = 1;
  block->managed.dl_tensor.dtype.code = KDL_UINT;
  block->managed.dl_tensor.dtype.bits = 8;
  block->managed.dl_tensor.dtype.lanes = 1;
  block->managed.dl_tensor.shape = block->shape;
  block->managed.deleter = dlpack_deleter_cb;
  atomic_fetch_add(&live, 1);
  *managed = &block->managed;
  return HVD_OK;
}

HVD_API size_t hvd_output_dlpack_live(void) { return atomic_load(&live); }
