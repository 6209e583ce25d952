#!/usr/bin/env bash
# Tiny Shakespeare -> llm.c data shards, the way llm.c's dev/data/tinyshakespeare.py does it:
# split the text at every blank line ("\n\n"), an EOT (50256) before each part, each part
# keeping its "\n\n" except the last; GPT-2 encode_ordinary; the first 32,768 tokens are
# validation, the rest training (uint16 shards, magic 20240520). Also writes
# gpt2_tokenizer.bin (llm.c's tokenizer file) for decoding samples.
#
# Outputs (under $LLMC_DATA_OUT, default data/):
#   tinyshakespeare/input.txt                  the text (copied or downloaded once)
#   tinyshakespeare/tiny_shakespeare_val.bin   32,768 tokens
#   tinyshakespeare/tiny_shakespeare_train.bin 305,260 tokens
#   gpt2_tokenizer.bin
# Returns at once when all outputs exist and are newer than input.txt. Run from anywhere;
# works in the repository root. Needs ./tokenizer (make tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${LLMC_DATA_OUT:-data}
dir=$out/tinyshakespeare
input=$dir/input.txt
val=$dir/tiny_shakespeare_val.bin
train=$dir/tiny_shakespeare_train.bin
tokfile=$out/gpt2_tokenizer.bin
text_url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
gpt2_url=https://openaipublic.blob.core.windows.net/gpt-2/encodings/main

[ -x ./tokenizer ] || { echo "error: ./tokenizer is missing: run 'make tokenizer' first" >&2; exit 1; }
mkdir -p "$dir"

fetch() { # fetch URL DEST: download atomically
    echo "downloading $1 -> $2" >&2
    curl -fsSL --retry 3 -o "$2.part" "$1" || { rm -f "$2.part"; echo "error: download of $1 failed" >&2; exit 1; }
    mv "$2.part" "$2"
}

if [ ! -s "$input" ]; then
    if [ -f ../shared/data/tinyshakespeare.txt ]; then
        cat ../shared/data/tinyshakespeare.txt > "$input.part" && mv "$input.part" "$input"
    else
        fetch "$text_url" "$input"
    fi
fi

if [ -s "$val" ] && [ -s "$train" ] && [ -s "$tokfile" ] && [ "$val" -nt "$input" ] && [ "$train" -nt "$input" ]; then
    echo "tiny Shakespeare: up to date ($val, $train, $tokfile)"
    exit 0
fi

if ! gpt2=$(./tokenizer find-gpt2 2>/dev/null); then
    mkdir -p data/gpt2
    fetch "$gpt2_url/encoder.json" data/gpt2/encoder.json
    fetch "$gpt2_url/vocab.bpe" data/gpt2/vocab.bpe
    gpt2=data/gpt2
fi

./tokenizer export --tokenizer "$gpt2" "$tokfile"
./tokenizer shards --quiet --tokenizer "$gpt2" --doc-split blank-lines --val-tokens 32768 \
    --shard-tokens 2147483647 --token-bytes 2 --no-index --overwrite -o "$dir/tiny_shakespeare" "$input"
echo "tiny Shakespeare: wrote $val, $train, $tokfile"
