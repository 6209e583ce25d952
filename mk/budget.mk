# budget.mk - --memory-budget (llmc/budget.c: the search over -r, -b, -z priced by the memory plan).
CORE_SRCS += llmc/budget.c
