# lora.mk - LoRA fine-tuning: the adapter table (llmc/models/lora.c) and PEFT's adapter directories
# (llmc/formats/adapter.c), the flag and resume rules (llmc/train/lora.c); the CPU ops (llmc/cpu/lora.c)
# come with llmc/cpu/*.c.
CORE_SRCS += llmc/core/quant.c llmc/models/lora.c llmc/formats/adapter.c llmc/train/lora.c
