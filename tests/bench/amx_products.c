/* The amx variant's products of a decode batch (1, 8, 16, 32 activation rows), int8 tile path
 * ("wide8") against the register tiles (called as model.c calls them: 4 weight rows x the
 * variant's mm_cols activation rows a call, 1 x 8 tiles at 8), on L copies of an 8B-shaped
 * matrix (L x the matrix far larger than the last-level cache, as a model's layers are), all
 * threads (OpenMP, one slice of 16-row strips each; OMP_NUM_THREADS=1 for one core). Built and
 * run by tests/bench/amx_products.sh on an AMX host.
 * Usage: amx_products TAG TYPE(2 = q4_0, 8 = q8_0) ROWS COLS L [all|wide8: the paths measured,
 * wide8 alone at 16 and 32 rows, regtile the register tiles alone, avx512vnni's where AMX is not
 * granted]; prints one line per path and batch (tag, variant, path, ...): best of 5 passes, ns
 * per 16 x 16 x 32 block per thread, ns per 16-block group of one weight row x 8 activation
 * rows per thread (a 1 x 8 tile's unit: 64 vpdpbusd), GMAC/s, weight GB/s. A pass repeats the
 * L copies until it has multiplied at least 2^27 weights (small matrices, which stay in cache,
 * would time too little otherwise). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels.h"
#include "model.h"
static unsigned long long xs=88172645463325252ULL;
static float rnd(void){xs^=xs<<13;xs^=xs>>7;xs^=xs<<17;return (float)(xs>>40)/16777216.0f-0.5f;}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  if(argc<6){fprintf(stderr,"usage: %s TAG TYPE ROWS COLS L [all|wide8|regtile]\n",argv[0]);return 2;}
  const char *tag = argv[1];
  int type = atoi(argv[2]), rows = atoi(argv[3]), cols = atoi(argv[4]), L = atoi(argv[5]);
  if((type!=HS_Q4_0 && type!=HS_Q8_0) || rows<16 || rows%16 || cols<32 || cols%32 || L<1){fprintf(stderr,"%s: TYPE 2 or 8, ROWS a multiple of 16, COLS of 32, L >= 1\n",argv[0]);return 2;}
  if(argc>6 && strcmp(argv[6],"all")!=0 && strcmp(argv[6],"wide8")!=0 && strcmp(argv[6],"regtile")!=0){fprintf(stderr,"%s: paths '%s': all, wide8 or regtile\n",argv[0],argv[6]);return 2;}
  int only_wide8 = argc > 6 && strcmp(argv[6], "wide8") == 0;
  int only_regtile = argc > 6 && strcmp(argv[6], "regtile") == 0;
  /* the register tiles alone also run where AMX is not granted: avx512vnni's (4 activation
   * rows a call) */
  const hs_kernels *k = hs_kernels_by_name("amx");
  if(!k && only_regtile) k = hs_kernels_by_name("avx512vnni");
  if(!k){fprintf(stderr,"%s: this CPU does not grant AMX%s\n",argv[0],only_regtile?" or AVX-512 VNNI":" (PATHS=regtile runs avx512vnni's register tiles)");return 1;}
  size_t rb = hs_row_bytes(type, cols);
  unsigned char *raw = malloc(rb*rows);
  unsigned char **w = malloc(sizeof(*w)*L);
  float *row = malloc(sizeof(float)*cols);
  srand(1);
  for(int r=0;r<rows;r++){ for(int c=0;c<cols;c++) row[c]=rnd();
    if(type==HS_Q4_0) hs_quantize_row_q4_0(row,(block_q4_0*)(raw+(size_t)r*rb),cols); else hs_quantize_row_q8_0(row,(block_q8_0*)(raw+(size_t)r*rb),cols);}
  for(int l=0;l<L;l++){ w[l]=aligned_alloc(64,(rb*rows+63)/64*64);
    #pragma omp parallel for
    for(int r=0;r<rows;r++) k->pack_row(type, raw+(size_t)r*rb, w[l]+(size_t)r*rb, cols);}
  int nmax=48; size_t as = k->act_bytes(cols);
  char *a = aligned_alloc(64, (as*nmax+63)/64*64);
  for(int i=0;i<nmax;i++){ for(int c=0;c<cols;c++) row[c]=rnd(); k->quantize_act(row, a+(size_t)i*as, cols);}
  float *out = aligned_alloc(64, sizeof(float)*rows*nmax);
  int nb = cols/32, T = omp_get_max_threads();
  hs_wide8_fn f = type==HS_Q4_0? k->wide8_q4_0 : k->wide8_q8_0;
  hs_mm_fn g = type==HS_Q4_0? k->mm_q4_0 : k->mm_q8_0;
  int ns[] = {1, 8, 16, 32};
  const int ct = k->mm_cols ? k->mm_cols : 4; /* model.c's activation rows a register-tile call */
  const double per_pass = (double)rows * cols * L;
  const int repeat = per_pass >= (double)(1 << 27) ? 1 : (int)((double)(1 << 27) / per_pass) + 1;
  for(int ni=0; ni<4; ni++) for(int path=0; path<2; path++){
    int n = ns[ni]; if(path==0 && n<16) continue; if(only_wide8 && path!=0) continue; if(only_regtile && path!=1) continue;
    /* weight rows a call: model.c's (one token: one row a call on wide rows, tile_rows) */
    const int wr = n == 1 && nb >= HS_WIDE_ROW_BLOCKS ? 1 : 4;
    double best=1e9;
    for(int rep=0;rep<5;rep++){
      double t0=now();
      for(int l=0;l<L*repeat;l++){
        #pragma omp parallel num_threads(T)
        { int t=omp_get_thread_num(); int per=(rows/16+T-1)/T*16; int r0=t*per, r1=r0+per<rows?r0+per:rows;
          if(r0<r1){ if(path==0) f(nb, w[l%L]+(size_t)r0*rb, rb, r1-r0, a, as, n, out+r0, rows);
          else for(int r=r0;r<r1;r+=wr) for(int c=0;c<n;c+=ct) g(nb, w[l%L]+(size_t)r*rb, rb, r1-r<wr?r1-r:wr, a+(size_t)c*as, as, n-c<ct?n-c:ct, out+(size_t)c*rows+r, rows);} }
      }
      double t=(now()-t0)/repeat; if(t<best) best=t;
    }
    double blocks = (double)rows/16*nb*((n+15)/16)*L;
    double groups8 = (double)rows*nb/16*((n+7)/8)*L; /* 16-block groups of a row x 8 act. rows */
    printf("%-6s %s %s q%d %dx%dx%d n=%2d T=%d: %8.2f ms/matrix  %6.1f ns/16x16x32 block-thread  %6.1f ns/group x 8 rows-thread  %7.1f GMAC/s  %6.1f GB/s weights\n", tag, k->name, path==0?"wide8  ":"regtile", type==HS_Q4_0?4:8, L, rows, cols, n, T, best*1e3/L, best*1e9*T/blocks, best*1e9*T/groups8, (double)rows*cols*n*L/best/1e9, (double)rb*rows*L/best/1e9);
  }
  return 0;
}
