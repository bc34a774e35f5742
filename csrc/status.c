/* Version, status sentences and the thread-local last-error message. */
#include "internal.h"
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

unsigned w4a16_version_number(void) { return W4A16_VERSION_NUMBER; }

#define W4A16_STR2_(x) #x
#define W4A16_STR_(x) W4A16_STR2_(x)
const char *w4a16_version_string(void) {
    return W4A16_STR_(W4A16_VERSION_MAJOR) "." W4A16_STR_(W4A16_VERSION_MINOR) "." W4A16_STR_(W4A16_VERSION_PATCH);
}

const char *w4a16_status_string(w4a16_status status) {
    switch (status) {
#define W4A16_STATUS_CASE_(name, value, text)                                                                          \
    case name:                                                                                                         \
        return text;
        W4A16_STATUS_LIST(W4A16_STATUS_CASE_)
#undef W4A16_STATUS_CASE_
    }
    return "unknown w4a16 status";
}

static _Thread_local char last_message[512];

const char *w4a16_last_error_message(void) { return last_message; }

void w4a16_clear_error(void) { last_message[0] = '\0'; }

w4a16_status w4a16_fail(w4a16_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return status;
}

w4a16_status w4a16_launch_status(int err, const char *op) {
    if (err == cudaSuccess) return W4A16_OK;
    return w4a16_fail(W4A16_ERR_LAUNCH_FAILED, "%s: kernel launch failed: %s", op,
                      cudaGetErrorString((cudaError_t)err));
}
