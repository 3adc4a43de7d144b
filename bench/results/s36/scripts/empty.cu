#include <cstdio>
#include <cuda_runtime.h>
__global__ void k() {}
int main() {
    cudaStream_t s; cudaStreamCreate(&s);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    e = cudaStreamEndCapture(s, &g);
    printf("empty capture: end %d graph %p\n", (int)e, (void*)g);
    size_t n = 0, ne = 0;
    e = cudaGraphGetNodes(g, NULL, &n); printf("GetNodes(NULL) %d n=%zu\n", (int)e, n); cudaGetLastError();
    e = cudaGraphGetEdges(g, NULL, NULL, NULL, &ne); printf("GetEdges %d ne=%zu\n", (int)e, ne); cudaGetLastError();
    cudaGraph_t g2; cudaGraphCreate(&g2, 0);
    n = 0; e = cudaGraphGetNodes(g2, NULL, &n); printf("created empty: GetNodes %d n=%zu\n", (int)e, n);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed); k<<<1,1,0,s>>>(); cudaGraph_t g3; cudaStreamEndCapture(s, &g3);
    n = 0; e = cudaGraphGetNodes(g3, NULL, &n); printf("one kernel: GetNodes %d n=%zu\n", (int)e, n);
    return 0;
}
