# checkfile.sh - sourced by the shell tests that refuse damaged model files (test_llama_vs_pytorch.sh,
# test_mlp_vs_pytorch.sh): expect_refused NAME SRC PYTHON MESSAGE CMD... writes $out/bad.bin, a copy
# of SRC with the bytearray b edited by PYTHON, runs CMD (which reads it) and prints PASS when it
# exits 1 with an "error: " line naming bad.bin and matching MESSAGE, else FAIL and status=1.
expect_refused() {
    local name=$1 src=$2 edit=$3 message=$4 msg rc
    shift 4
    /usr/bin/python3 -c "import struct,sys; b=bytearray(open(sys.argv[1],'rb').read()); $edit; open(sys.argv[2],'wb').write(b)" \
        "$src" "$out/bad.bin"
    set +e
    msg=$("$@" 2>&1)
    rc=$?
    set -e
    if [ $rc -eq 1 ] && grep -q "error: .*bad.bin.*$message" <<<"$msg"; then echo "PASS: $name"
    else echo "FAIL: $name (exit $rc): $msg" | head -3; status=1; fi
}
