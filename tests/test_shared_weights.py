"""The weights of a class are one copy: two processes that load the same model both read the converted safetensors
file's memory map (its pages shared and clean, the processes' own anonymous memory small beside the weights), and a
learner's in-place edit of a weight stays in that learner's process (the file and the other process keep the
original values). A copy or a dtype conversion at load would make each kernel hold its own weights: these tests
fail then. Linux only (they read /proc/<pid>/smaps)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmwalk import classroom, models
from markers import needs_gemma

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/<pid>/smaps (Linux only)")
REPO = Path(__file__).resolve().parents[1]

# A learner's kernel: load, run a forward pass (it reads every weight), report, then obey "zero" / "sum" / "quit".
CHILD = r"""
import json, os, sys
import torch, llmwalk as lw
from llmwalk.weights import tensors
model = lw.load_model(sys.argv[1], progress=False)
lw.forward(model, model.tokenizer.encode("The capital of France is"))
maps = []
for line in open(f"/proc/{os.getpid()}/maps"):
    if line.rstrip().endswith("model.safetensors"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        maps.append((lo, hi, line.split()[-1]))
seen, inside = {}, 0
for _, t in tensors(model.weights):
    if t.untyped_storage().data_ptr() not in seen:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        inside += t.untyped_storage().nbytes() * any(lo <= t.data_ptr() < hi for lo, hi, _ in maps)
w = model.weights.blocks[0].ffn_up.weight           # the weight a learner zeroes
print(json.dumps({"files": sorted({p for *_, p in maps}), "weight_bytes": sum(seen.values()),
                  "bytes_in_file_map": inside}), flush=True)
for command in sys.stdin:
    if command.strip() == "zero":
        w.mul_(0)
    print(json.dumps(float(w.abs().sum())), flush=True)
"""


class Learner:
    """A Python process that loaded `name` (a stand-in for a kernel: the same load, no Jupyter in between)."""

    def __init__(self, name: str):
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def report(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the learner process ended (exit status {self.proc.wait()}) before loading the model"
        return json.loads(line)

    def ask(self, command: str) -> float:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.report()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(params=["smollm2-135m", pytest.param("gemma3-270m", marks=needs_gemma)])
def two_learners(request):
    """Two processes that loaded the same model, with what each reported; both are killed even when a test fails."""
    models_ = []
    try:
        models_ = [Learner(request.param), Learner(request.param)]
        yield [(learner, learner.report()) for learner in models_]
    finally:
        for learner in models_:
            learner.stop()


def test_every_weight_is_a_shared_clean_page_of_the_converted_file(two_learners):
    for learner, seen in two_learners:
        assert len(seen["files"]) == 1 and seen["files"][0].startswith(str(models.cache_dir())), \
            f"the weights are not read from one memory-mapped file of llmwalk's cache: mapped {seen['files']}"
        assert seen["bytes_in_file_map"] == seen["weight_bytes"], \
            (f"{(seen['weight_bytes'] - seen['bytes_in_file_map']) / 2**20:.0f} of {seen['weight_bytes'] / 2**20:.0f}"
             " MB of weights are private copies, not the file's memory map: a copy or a dtype conversion at load?")
        mem, size = classroom.memory(learner.proc.pid), Path(seen["files"][0]).stat().st_size / 2**20
        # The forward pass read every weight: the file's pages are resident, shared with the other process, and none
        # is a private (written) copy; what the process holds of its own is small beside the weights.
        assert mem.weights_mapped > 0.95 * size and mem.weights_shared > 0.95 * size, mem
        assert mem.weights_written == 0, mem
        assert mem.private_anonymous < 0.5 * seen["weight_bytes"] / 2**20, \
            f"{mem.private_anonymous:.0f} MB of anonymous memory for {seen['weight_bytes'] / 2**20:.0f} MB of weights"


def test_a_learners_in_place_edit_stays_in_that_learners_process(two_learners):
    (editor, seen), (other, _) = two_learners
    weights_file = Path(seen["files"][0])
    before = models.sha256_of(weights_file)
    original = other.ask("sum")
    assert original > 0 and editor.ask("sum") == original
    assert editor.ask("zero") == 0                        # model.weights.blocks[0].ffn_up.weight.mul_(0)
    assert other.ask("sum") == original, "a learner's in-place edit reached another process's weights"
    assert classroom.memory(editor.proc.pid).weights_written > 0        # the edited pages became the editor's own
    assert models.sha256_of(weights_file) == before, "a learner's in-place edit was written to the cached file"


HEAP_CHILD = r"""
import ctypes, json, sys
import llmwalk as lw
from llmwalk import classroom
model = lw.load_model(sys.argv[1], progress=False)        # kept, as a notebook keeps it
before = classroom.memory("self").private_anonymous
ctypes.CDLL(None).malloc_trim(0)
print(json.dumps(before - classroom.memory("self").private_anonymous))
"""


@needs_gemma
def test_loading_gemma_gives_back_the_heap_its_tokenizer_parse_freed():
    # Parsing Gemma-3's 33 MB tokenizer.json frees ~170 MB in small pieces; glibc would keep them for the kernel's
    # life, in every learner's kernel. What a trim right after the load still finds to give back is what was kept.
    out = subprocess.run([sys.executable, "-c", HEAP_CHILD, "gemma3-270m"], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) < 20, f"{json.loads(out.stdout):.0f} MB of freed heap were kept after loading"


MAP_AND_WAIT = r"""
import mmap, sys
with open(sys.argv[1], "rb") as f:
    view = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
sum(view[i] for i in range(0, len(view), 4096))           # touch every page
print("mapped", flush=True)
sys.stdin.readline()
"""


def test_a_file_copied_moments_ago_counts_as_shared(tmp_path):
    """A class's cache is often written just before the kernels map it: its pages are still dirty in the page cache
    (not yet written back), and they are one copy all the same. Counting only Shared_Clean called them unshared."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(os.urandom(16 * 2**20))             # dirty pages, no fsync
    readers = [subprocess.Popen([sys.executable, "-c", MAP_AND_WAIT, str(weights)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [r.stdout.readline().strip() for r in readers] == ["mapped", "mapped"]
        for reader in readers:
            mem = classroom.memory(reader.pid)
            assert mem.weights_mapped > 15.9, mem
            assert mem.weights_shared == mem.weights_mapped and mem.weights_written == 0, mem
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()


def test_the_graders_cached_layer_holds_the_models_own_weights_not_a_copy(smollm2, monkeypatch):
    """The FFN exercise's real case (SmolLM2's layer 3, cached for the life of the kernel) passes the checkpoint's
    [out, in] layout as views of the shared weights: a copy would cost every learner's kernel 10.6 MB of its own."""
    from llmwalk.exercises import catalogue
    monkeypatch.setattr(catalogue, "load_model", lambda progress=True: smollm2)
    x, w_gate, w_up, w_down = catalogue._smollm2_layer3.__wrapped__()
    block, c = smollm2.weights.blocks[3], smollm2.config
    assert (w_gate.shape, w_up.shape, w_down.shape) == ((c.d_ff, c.d_model), (c.d_ff, c.d_model), (c.d_model, c.d_ff))
    assert [w.data_ptr() for w in (w_gate, w_up, w_down)] == \
        [lin.weight.data_ptr() for lin in (block.ffn_gate, block.ffn_up, block.ffn_down)]
