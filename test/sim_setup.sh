# sim_setup.sh - sourced (never run) by the scripts that drive ./train_gpt through the cudasim harness:
#   . "$(dirname "$0")/sim_setup.sh" NAME
# cds to the repository root, sets SIM (build/cudasim/train_gpt), fails unless SIM and ./train_gpt_cpu
# are built, and makes W a fresh /tmp/NAME.XXXXXX folder that is removed on exit.
cd "$(dirname "$0")/.."
SIM=build/cudasim/train_gpt
[ -x "$SIM" ] && [ -x ./train_gpt_cpu ] || { echo "FAIL: build $SIM and train_gpt_cpu first"; exit 1; }
W=$(mktemp -d "/tmp/$1.XXXXXX")
trap 'rm -rf "$W"' EXIT
