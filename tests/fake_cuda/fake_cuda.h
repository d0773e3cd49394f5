/* fake_cuda.h: what fake_cuda.c (memory, copies, streams, modules,
 * launches) and fake_graph.c (stream capture and graphs) of the stand-in
 * libcuda.so.1 share. Not an interface: both halves are one library. */
#ifndef KHUB_FAKE_CUDA_H
#define KHUB_FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>

#define EXPORT          __attribute__((visibility("default")))
#define FAKE_MAX_PARAMS 24
#define FAKE_MAX_FNS    64

enum {
    CU_OK = 0,
    CU_INVALID_VALUE = 1,
    CU_OUT_OF_MEMORY = 2,
    CU_NOT_INITIALIZED = 3,
    CU_NO_DEVICE = 100,
    CU_INVALID_DEVICE = 101,
    CU_INVALID_CONTEXT = 201,
    CU_INVALID_HANDLE = 400,
    CU_ILLEGAL_STATE = 401,
    CU_NOT_FOUND = 500,
    CU_LAUNCH_FAILED = 719,
    CU_CAPTURE_UNSUPPORTED = 900, /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
    CU_CAPTURE_INVALIDATED = 901, /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
    CU_CAPTURE_IMPLICIT = 906,    /* CUDA_ERROR_STREAM_CAPTURE_IMPLICIT */
    CU_GRAPH_UPDATE_FAILURE = 910 /* CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE */
};

/* One operation on a stream, run at once or recorded into a graph. */
enum { NODE_KERNEL = 1, NODE_HTOD, NODE_DTOH, NODE_DTOD };
typedef struct fake_node {
    int kind;
    int fn;                                     /* kernel: index into the function names */
    int dev;                                    /* kernel: the device it was launched on */
    unsigned grid[3], block[3], shared;         /* kernel: dimensions, shared bytes */
    int n_params;                               /* kernel: parameters copied, 8 bytes each */
    unsigned long long params[FAKE_MAX_PARAMS]; /* by value, as a driver copies them */
    unsigned long long dst, src;                /* copies: addresses (host or device) */
    size_t n;                                   /* copies: bytes */
} fake_node;

typedef struct fake_graph fake_graph;

typedef struct fake_stream {
    struct fake_stream *next;
    int dev;
    long pending;        /* launches since the last synchronisation */
    fake_graph *capture; /* the graph being captured, NULL when not capturing */
    int capture_mode;    /* CUstreamCaptureMode: 0 global, 1 thread-local, 2 relaxed */
    int invalidated;     /* the capture broke: its operations and its end fail */
} fake_stream;

/* fake_cuda.c */
extern pthread_mutex_t fake_lock; /* memory, copies, streams and graphs */
int fake_fails(const char *name);
fake_stream *fake_find_stream(void *s);
/* Runs a kernel node now: logs it, runs its host body when a test gave
 * one (khub_fake_cuda_kernel), marks the stream busy (NULL: legacy). */
void fake_run_kernel(const fake_node *k, fake_stream *s);
/* Runs a copy node now (checked against the allocations): 0 or an error. */
int fake_run_copy(const fake_node *c);
extern fake_stream *fake_streams;

/* fake_graph.c, under fake_lock */
/* Where an operation on stream (NULL = legacy) goes: 0 = run it now;
 * FAKE_RECORDED = recorded into the stream's capture; else the error it
 * fails with (a
 * legacy-stream operation while a stream captures is
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates that capture; an
 * operation on an invalidated capture is ..._INVALIDATED). */
#define FAKE_RECORDED (-1)
int fake_capture_gate(void *stream, const fake_node *op);
/* A synchronisation of stream (NULL = legacy) during a capture: 0 when it
 * may proceed, else its error (the capture invalidated). */
int fake_capture_sync(void *stream);
/* An allocation during a capture of mode global or thread-local: 0 or
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (the capture invalidated). */
int fake_capture_alloc(void);
/* The capture of a stream being destroyed, dropped. */
void fake_capture_drop(fake_stream *s);
long fake_graph_stat(const char *what, int *found);
/* The graph entry points, handed out by cuGetProcAddress_v2. */
EXPORT int cuStreamBeginCapture_v2(void *stream, int mode);
EXPORT int cuStreamEndCapture(void *stream, void **graph);
EXPORT int cuStreamIsCapturing(void *stream, int *status);
EXPORT int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
EXPORT int cuGraphExecUpdate_v2(void *exec, void *graph, void *result_info);
EXPORT int cuGraphLaunch(void *exec, void *stream);
EXPORT int cuGraphDestroy(void *graph);
EXPORT int cuGraphExecDestroy(void *exec);

#endif /* KHUB_FAKE_CUDA_H */
