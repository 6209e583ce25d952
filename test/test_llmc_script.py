#!/usr/bin/env python3
"""llm.c's run scripts unchanged (issue 27): copies of scripts/run_gpt2_124M.sh's command line and
restart loop (the flags -i -j -o -v -s -g -h -b -t -d -r -z -c -l -q -u -n -y -e, no -x: one epoch)
at a tiny scale, under mpirun -np 2 and on one process, in a directory laid out as llm.c's (the
shards under dev/data/, HellaSwag's file at dev/data/hellaswag/hellaswag_val.bin).

- the loop ends when DONE_<last step> appears: the run trained one epoch, validated at step 0 and
  every -v steps, scored HellaSwag every -v steps and at the last step ("HellaSwag: N/M = ACC",
  hellaswag_acc in log.jsonl), sampled, checkpointed every -n steps;
- run again, the script exits at once (the DONE file exists);
- run_gpt3_125M.sh's line (-e gpt3:cC, -nk -nm -ge -sl -sg -x) at gpt3:c384 trains and exits;
- killed in the middle (SIGKILL after its first checkpoint), the loop's next -y 1 resumes it and
  the run ends with the same final model as the uninterrupted one.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from test_eval import evalfile, shakespeare_examples  # noqa: E402
from testlib import failed_count, report  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive", "OMPI_ALLOW_RUN_AS_ROOT": "1",
       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
       "OMPI_MCA_oob_tcp_if_include": "lo"}
STEPS = 12  # one epoch: 12 steps of -d 256 tokens (the shard holds 12 * 256 + 1)

# run_gpt2_124M.sh with its values scaled down (-np 8 -> 2, -b 64 -t 1024 -d 524288 -> -b 4 -t 32 -d 256,
# d12 -> d1, -v 250 -s 20000 -g 144 -u 700 -n 5000 -> 4 8 16 2 4); nothing else changed
SCRIPT = r'''# GPT-2 (124M) repro on FineWeb, at a tiny scale
out_dir="log_gpt2_124M"
done_file="$out_dir/DONE_%08d"

# in case the training stalls or crashes, loop to resume (-y 1)
while true; do

    # exit condition is that optimization has finished
    if [ -f "$done_file" ]; then
        echo "File $done_file exists. Exiting the loop."
        break
    fi

    # run python dev/data/fineweb.py --version 10B to prepro data
    # run python dev/data/hellaswag.py to prepro hellaswag eval
    %s %s \
                -i "dev/data/fineweb10B/fineweb_train_*.bin" \
                -j "dev/data/fineweb10B/fineweb_val_*.bin" \
                -o $out_dir \
                -v 4 -s 8 -g 16 \
                -h 1 \
                -b 4 -t 32 \
                -d 256 \
                -r 0 \
                -z 1 \
                -c 0.1 \
                -l 0.0006 \
                -q 0.0 \
                -u 2 \
                -n 4 \
                -y 1 \
                -e "d1"

    sleep 1
done
'''


# run_gpt3_125M.sh's line (its extra flags: -nk -nm -ge -sl -sg -x and -e "gpt3:c768"), scaled down to
# gpt3:c384 (GPT-3's tiny shape, maxT 2048) and 3 steps
SCRIPT3 = r'''out_dir="log_gpt3_125M"
done_file="$out_dir/DONE_00000003"

while true; do

    # exit condition is that optimization has finished
    if [ -f "$done_file" ]; then
        echo "File $done_file exists. Exiting the loop."
        break
    fi

    %s \
                -i "dev/data/fineweb10B/fineweb_train_*.bin" \
                -j "dev/data/fineweb10B/fineweb_val_*.bin" \
                -o $out_dir \
                -v 2 -s 20000 -g 144 \
                -h 1 \
                -b 4 -t 32 \
                -d 256 \
                -r 0 \
                -z 1 \
                -c 0.1 \
                -l 0.0006 \
                -q 0.1 \
                -u 1 \
                -n 2 \
                -nk 5 \
                -nm 50000 \
                -ge 1 \
                -sl 7.0 \
                -sg 7.0 \
                -y 1 \
                -x 3 \
                -e "gpt3:c384"

    sleep 1
done
'''


def shard(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(toks)] + [0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def layout(d, text):
    os.makedirs(os.path.join(d, "dev/data/fineweb10B"))
    os.makedirs(os.path.join(d, "dev/data/hellaswag"))
    shard(os.path.join(d, "dev/data/fineweb10B/fineweb_train_000001.bin"), list(text[:STEPS * 256 + 1]))
    shard(os.path.join(d, "dev/data/fineweb10B/fineweb_val_000000.bin"), list(text[50000:50000 + 1025]))
    evalfile(os.path.join(d, "dev/data/hellaswag/hellaswag_val.bin"), shakespeare_examples(9, 3, text))


def check_run(d, name, out):
    log = os.path.join(d, "log_gpt2_124M", "log.jsonl")
    recs = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
    hs = [r["step"] for r in recs if "hellaswag_acc" in r]
    val = [r["step"] for r in recs if "val_loss" in r]
    ckpts = sorted(f for f in os.listdir(os.path.join(d, "log_gpt2_124M")) if f.startswith("DONE_")) if recs else []
    report(f"DONE_{STEPS:08d} exists. Exiting the loop." in out and hs == [4, 8, 12] and val == [0, 4, 8, 12] and
           out.count("HellaSwag: ") >= 3 and ckpts == [f"DONE_{s:08d}" for s in (4, 8, 12)],
           f"{name}: the loop ran one epoch ({STEPS} steps), validated at 0 and every 4, HellaSwag at 4, 8, 12, "
           "checkpoints every 4, then exited on the DONE file", f"hellaswag {hs}, val {val}, {ckpts}: {out[-1500:]}")


def run_script(d, env, timeout):
    """bash run.sh in d; on timeout (a loop that never ends: the trainer failing every time) its
    process group (the shell and the trainer it started) is killed and the output so far returned."""
    proc = subprocess.Popen(["bash", "run.sh"], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, out + f"\n(the loop was still running after {timeout} s: killed)"


def main():
    data = os.environ.get("LLMC_DATA_DIR", os.path.join(ROOT, "..", "shared", "data"))
    text = bytes(b for b in open(os.path.join(data, "tinyshakespeare.txt"), "rb").read() if b < 128)
    env = {**ENV, "LLMC_DATA_DIR": os.path.abspath(data)}
    tmp = tempfile.mkdtemp(prefix="llmc_script.")
    cpu = os.path.join(ROOT, "train_gpt_cpu")
    try:
        runs = {}
        for name, launcher in (("mpirun -np 2", "mpirun --oversubscribe -np 2"), ("one process", "")):
            d = os.path.join(tmp, name.replace(" ", "_"))
            layout(d, text)
            with open(os.path.join(d, "run.sh"), "w") as f:
                f.write(SCRIPT % (STEPS, launcher, cpu))
            _, out = run_script(d, env, 240)
            check_run(d, f"run_gpt2_124M.sh-style loop, {name}", out)
            runs[name] = d
        d = runs["one process"]
        rc, out = run_script(d, env, 30)
        report(rc == 0 and out.strip() == f"File log_gpt2_124M/DONE_{STEPS:08d} exists. Exiting the loop.",
               "the script run again exits at once on the DONE file", out[-300:])
        g = os.path.join(tmp, "gpt3")
        layout(g, text)
        with open(os.path.join(g, "run.sh"), "w") as f:
            f.write(SCRIPT3 % cpu)
        rc, out = run_script(g, env, 240)
        log = os.path.join(g, "log_gpt3_125M", "log.jsonl")
        recs = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
        report(rc == 0 and "DONE_00000003 exists. Exiting the loop." in out and "maxT 2048" in out and
               [r["step"] for r in recs if "hellaswag_acc" in r] == [2, 3],
               "run_gpt3_125M.sh-style loop (gpt3:c384, -nk -nm -ge -sl -sg -x): trains, HellaSwag at 2 and 3, exits on "
               "DONE", out[-1500:])
        # killed after its first checkpoint: the loop resumes it with -y 1
        k = os.path.join(tmp, "killed")
        layout(k, text)
        with open(os.path.join(k, "run.sh"), "w") as f:
            f.write(SCRIPT % (STEPS, "", cpu))
        proc = subprocess.Popen(["bash", "run.sh"], cwd=k, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=env, start_new_session=True)
        first = os.path.join(k, "log_gpt2_124M", "DONE_00000004")
        deadline = time.time() + 120
        while not os.path.exists(first) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        killed = False
        try:  # the trainer: the script's child, by its id
            for pid in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split():
                if open(f"/proc/{pid}/comm").read().strip() == "train_gpt_cpu":
                    os.kill(int(pid), signal.SIGKILL)
                    killed = True
        except OSError:
            pass
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0] + "\n(the loop was still running after 240 s: killed)"
        final = f"log_gpt2_124M/model_{STEPS:08d}.bin"
        same = os.path.exists(os.path.join(k, final)) and \
            open(os.path.join(k, final), "rb").read() == open(os.path.join(d, final), "rb").read()
        report(killed and "resumed from step" in out and same and f"DONE_{STEPS:08d} exists" in out,
               "SIGKILL after the first checkpoint: the loop's -y 1 resumes, the final model equals the uninterrupted run's",
               f"killed {killed}: {out[-1500:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return failed_count()


if __name__ == "__main__":
    sys.exit(main())
