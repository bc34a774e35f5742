/* A stand-in libcuda.so.1 for machines without an NVIDIA driver: it lets an engine's compiled extensions, which
 * link the driver, be loaded so that their op schemas can be read. Every entry point answers
 * CUDA_ERROR_NO_DEVICE (100); nothing can run on it. Build: cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1
 * stub_libcuda.c. The list holds the driver symbols the engines' extensions import (nm -D --undefined-only). */
#define STUB(name) int name(void) { return 100; }

STUB(cuCtxFromGreenCtx)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuDevResourceGenerateDesc)
STUB(cuDevSmResourceSplitByCount)
STUB(cuDeviceGetDevResource)
STUB(cuDriverGetVersion)
STUB(cuGetErrorString)
STUB(cuGetProcAddress_v2)
STUB(cuGreenCtxCreate)
STUB(cuGreenCtxDestroy)
STUB(cuGreenCtxGetDevResource)
STUB(cuInit)
STUB(cuPointerGetAttribute)
STUB(cuStreamCreate)
