# Tensor parallelism (issue 25, first slice): the tensor- and data-parallel groups of the process
# group (llmc/dist/layout.c) and the loop's gathers of a tensor-parallel model (llmc/train/tp.c).
CORE_SRCS += llmc/dist/layout.c llmc/train/tp.c
