#!/usr/bin/env bash
# FineWeb-style corpus -> llm.c shards (for machines with internet; NOT tested in CI here).
#
#   data/fineweb.sh [N_PARQUET_FILES] [OUT_PREFIX]
#
# Downloads N parquet files (default 1, ~2 GB each, ~1B tokens) of HuggingFaceFW/fineweb
# sample-10BT with curl, converts each to JSONL ({"text": ...} per line) with pyarrow
# (pip install pyarrow), and runs ./tokenizer shards on them: an EOT before every document,
# 100M-token uint16 shards, the first shard is validation, as llm.c's fineweb.py does.
# Output: OUT_PREFIX_val_000000.bin, OUT_PREFIX_train_000001.bin, ...
# (default OUT_PREFIX data/fineweb10B/fineweb). Any JSONL with a "text" field works the same:
#   ./tokenizer shards -o data/mycorpus/mycorpus file1.jsonl file2.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1}
prefix=${2:-data/fineweb10B/fineweb}
base=https://huggingface.co/datasets/HuggingFaceFW/fineweb/resolve/main/sample/10BT
dl=data/fineweb10B/download
[ -x ./tokenizer ] || { echo "error: ./tokenizer is missing: run 'make tokenizer'" >&2; exit 1; }
mkdir -p "$dl" "$(dirname "$prefix")"
jsonl=()
for ((i = 0; i < n; i++)); do
    name=$(printf '%03d_00000' "$i")
    pq=$dl/$name.parquet
    js=$dl/$name.jsonl
    if [ ! -s "$pq" ]; then
        echo "downloading $base/$name.parquet" >&2
        curl -fL --retry 5 -o "$pq.part" "$base/$name.parquet"
        mv "$pq.part" "$pq"
    fi
    if [ ! -s "$js" ]; then
        python3 - "$pq" "$js.part" <<'PY'
import json, sys
import pyarrow.parquet as pq
f = pq.ParquetFile(sys.argv[1])
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for batch in f.iter_batches(columns=["text"], batch_size=4096):
        for text in batch.column(0).to_pylist():
            out.write(json.dumps({"text": text}) + "\n")
PY
        mv "$js.part" "$js"
    fi
    jsonl+=("$js")
done
./tokenizer shards --shard-tokens 100000000 --overwrite -o "$prefix" "${jsonl[@]}"
