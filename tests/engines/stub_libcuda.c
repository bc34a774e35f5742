/* A stand-in for the CUDA driver (libcuda.so.1) on machines without a GPU, for the engine tests only.
 *
 * The engines' compiled extensions (vLLM's _C / _C_stable_libtorch, cumem_allocator) name libcuda.so.1 as a
 * dependency and import a few driver entry points, so without a driver they cannot be loaded and their op schemas
 * cannot be read. This library exports those entry points plus the ones the CUDA runtime looks up first, and answers
 * every call with CUDA_ERROR_NO_DEVICE (cuDeviceGetCount: zero devices), so torch and the engines see a machine
 * with no GPU. Build: cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 stub_libcuda.c */
#include <stddef.h>

typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_NO_DEVICE = 100 };

#define STUB(name)                                                                                                     \
    CUresult name(void) { return CUDA_ERROR_NO_DEVICE; }

CUresult cuInit(unsigned flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}
CUresult cuDriverGetVersion(int *version) {
    if (version) *version = 0;
    return CUDA_ERROR_NO_DEVICE;
}
CUresult cuDeviceGetCount(int *count) {
    if (count) *count = 0;
    return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetProcAddress(const char *symbol, void **fn, int version, unsigned long long flags) {
    (void)symbol;
    (void)version;
    (void)flags;
    if (fn) *fn = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, void *status) {
    (void)status;
    return cuGetProcAddress(symbol, fn, version, flags);
}
CUresult cuGetErrorString(CUresult error, const char **str) {
    (void)error;
    if (str) *str = "no CUDA device (w4a16 test stub driver)";
    return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult error, const char **str) {
    (void)error;
    if (str) *str = "CUDA_ERROR_NO_DEVICE";
    return CUDA_SUCCESS;
}

/* imported by vLLM's _C (0.15) / _C_stable_libtorch (0.33) and cumem_allocator,
 * and by SGLang's sgl_kernel extension (green contexts, stream creation) */
STUB(cuPointerGetAttribute)
STUB(cuTensorMapEncodeTiled)
STUB(cuCtxGetCurrent)
STUB(cuCtxSetCurrent)
STUB(cuDeviceGet)
STUB(cuDeviceGetAttribute)
STUB(cuDevicePrimaryCtxRetain)
STUB(cuMemAddressFree)
STUB(cuMemAddressReserve)
STUB(cuMemCreate)
STUB(cuMemGetAllocationGranularity)
STUB(cuMemMap)
STUB(cuMemRelease)
STUB(cuMemSetAccess)
STUB(cuMemUnmap)
STUB(name)
STUB(cuCtxFromGreenCtx)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuDevResourceGenerateDesc)
STUB(cuDevSmResourceSplitByCount)
STUB(cuDeviceGetDevResource)
STUB(cuGreenCtxCreate)
STUB(cuGreenCtxDestroy)
STUB(cuGreenCtxGetDevResource)
STUB(cuStreamCreate)
