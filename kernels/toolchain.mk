# kernels/toolchain.mk -- the compilers of kernels/Makefile and lab/Makefile (included by both).
# CC (cc); NVCC: nvcc on PATH, or $(CUDA_HOME)/bin/nvcc; CUDA: 1 when that nvcc exists (set
# CUDA=0 for a C-only build); CUDA_ARCH: 90 (sm_90 only, as in CI); BUILD_DIR: build/cuda or
# build/cpu, so that the C-only and the CUDA build never mix their objects.
CC ?= cc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null))
NVCC ?= $(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc,)
CUDA ?= $(if $(wildcard $(NVCC)),1,0)
CUDA_ARCH ?= 90
BUILD_DIR ?= build/$(if $(filter 1,$(CUDA)),cuda,cpu)
