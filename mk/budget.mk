# budget.mk - --memory-budget (llmc/train/budget.c: the search over -r, -b, -z priced by the memory plan).
CORE_SRCS += llmc/train/budget.c
