"""SGLangEngine: the interface of machinery/engine.py on SGLang, in-process or over HTTP.

With it, what SGLang's processes need around them: the environment its start runs in, the engine's own temp
folder, and at shutdown the /dev/shm files, zombies and resource tracker its killed processes leave. Apart from
the HF engine so that this process-level care sits beside the one backend that needs it; sglang itself is imported
only when an engine starts. scripts/sglang_env.sh reads SGLANG_VERSION from this file.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time

import torch

from machinery.engine import GenOutput, SamplingParams, check_params, check_score_start

SGLANG_VERSION = "0.5.23"  # the release this adapter is written and contract-tested against


def sglang_sampling_params(p: SamplingParams, extra_stop_token_ids=()) -> dict:
    """Our SamplingParams as SGLang's sampling_params dict (sglang/srt/sampling/sampling_params.py)."""
    d = {
        "temperature": p.temperature,  # SGLang runs temperature 0 as temperature 1 with top_k = 1
        "top_p": p.top_p,
        "top_k": p.top_k,
        "max_new_tokens": p.max_new_tokens,
        "stop_token_ids": sorted({*p.stop_token_ids, *extra_stop_token_ids}) or None,
        "stop": list(p.stop) or None,
        "no_stop_trim": True,          # keep the matched stop string / token in the output
        "skip_special_tokens": False,  # stop strings may be special-looking markers
    }
    if p.seed is not None:
        d["sampling_seed"] = int(p.seed)  # honoured only with enable_deterministic_inference
    return {k: v for k, v in d.items() if v is not None}


def sglang_gen_output(out: dict) -> GenOutput:
    """Parse SGLang's generate result (`output_ids` + `meta_info`) into a GenOutput."""
    meta = out["meta_info"]
    fr = meta["finish_reason"]
    kind = fr.get("type") if isinstance(fr, dict) else fr
    if kind not in ("stop", "length"):
        raise RuntimeError(f"SGLang request ended with finish_reason={fr!r}")
    ids = [int(t) for t in out["output_ids"]]
    lp = meta["output_token_logprobs"]  # [(logprob, token_id, text or None), ...] per generated token
    if len(lp) < len(ids) or [int(e[1]) for e in lp[:len(ids)]] != ids:
        raise RuntimeError(f"SGLang output_token_logprobs ({len(lp)} entries) do not line up with "
                           f"output_ids ({len(ids)} tokens)")
    return GenOutput(ids, [float(e[0]) for e in lp[:len(ids)]], kind)


def sglang_scores(out: dict, input_ids: list[int], start: int) -> list[float]:
    """Log-probs of input_ids[start:] from a request sent with logprob_start_len = start - 1.
    SGLang's input_token_logprobs cover input_ids[logprob_start_len:], the first one None."""
    lp = out["meta_info"]["input_token_logprobs"]
    if [int(e[1]) for e in lp] != input_ids[start - 1:] or lp[0][0] is not None:
        raise RuntimeError(f"SGLang input_token_logprobs ({len(lp)} entries) do not cover input_ids[{start - 1}:] "
                           f"({len(input_ids) - start + 1} tokens)")
    return [float(e[0]) for e in lp[1:]]


class _LoopProxy:
    """Stands in for sglang.Engine.loop. The Engine's sync methods (flush_cache,
    update_weights_from_tensor, ...) do `self.loop.run_until_complete(coro)`; its
    TokenizerManager binds its receive loop to the first event loop that sends a request.
    We keep one loop running in a daemon thread for both, so the adapter works from any
    thread and from any (even short-lived, asyncio.run) caller loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def run_until_complete(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class SGLangEngine:
    """The same interface on SGLang: in-process `sglang.Engine(model_path=...)` on a GPU or on the CPU
    (device="cpu": SGLang's CPU engine, attention in torch_native), or an already running server
    (`server_url="http://127.0.0.1:30000"`). Token in, token out.

    Differences from HFEngine: SGLang always stops at the model's own EOS (eos_token_ids are
    added as extra stop tokens); per-request seeds are honoured only with
    deterministic=True (SGLang's enable_deterministic_inference, which its CPU attention
    backend lacks: refused here at construction). update_weights() over HTTP sends tensors by
    shared-memory handles (CUDA IPC on a GPU), so the trainer must run on the server's machine.

    Lifecycle, as SGLang wants it: build the in-process engine in the main thread (it
    installs signal handlers); call release_memory() only while no request runs, and after
    resume_memory() push the weights again (update_weights) before generating: released
    weights are not backed up (unless enable_weights_cpu_backup=True is passed through).
    Without SGLang's memory saver (it needs CUDA; never on the CPU) there is nothing to free,
    and release/resume return at once. shutdown() kills every child process of this process
    (SGLang's kill_process_tree), sandbox workers included, so call it last; it then removes
    the /dev/shm files the engine's killed processes leave behind.
    """

    def __init__(self, model_path: str | None = None, *, server_url: str | None = None, deterministic: bool = False,
                 eos_token_ids=None, dtype: str = "bfloat16", mem_fraction_static: float = 0.5, seed: int = 0,
                 tp_size: int = 1, device: str = "cuda", timeout_s: float = 600.0, max_batch: int = 0,
                 max_context: int = 0, **engine_kwargs):
        self.extra_stop = sorted({int(t) for t in eos_token_ids or []})
        self.tp_size, self.timeout_s = tp_size, timeout_s
        self._engine = self._url = self._pool = None
        if server_url:
            from concurrent.futures import ThreadPoolExecutor
            self._url = server_url.rstrip("/")
            self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="sglang-http")
            self.frees_memory = bool(self._request("/server_info", None).get("enable_memory_saver"))
            return
        if model_path is None:
            raise ValueError("SGLangEngine needs model_path (in-process engine) or server_url")
        dev = torch.device(device)
        if dev.type == "cpu":
            if deterministic:
                raise ValueError("--deterministic with --engine sglang on the CPU: SGLang's CPU engine runs attention "
                                 "in torch_native, which it cannot make deterministic (only GPU backends such as fa3, "
                                 "flashinfer and triton can); use --engine hf for bit-exact runs on a CPU")
            os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # read when sglang is imported, here and in its processes
            # A GPU is a rank's own, but a CPU's memory is shared by every rank of the machine (torchrun's local
            # ranks): the share is the machine's, split between them, and set as a KV-cache size in tokens.
            # SGLang's own fraction would size each engine's cache from the memory free when it starts, which
            # the engines of the other ranks, starting beside it, are taking: it failed or not by their timing.
            share = mem_fraction_static / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            tokens = _cpu_kv_tokens(model_path, dtype, share)
            if max_batch and max_context:  # no more than the caller can have in flight (SGLang zero-fills the
                # whole cache, so a share sized for a GPU's work takes that memory from the trainers beside it):
                # max_batch sequences at once, each of at most max_context tokens, and one spare
                tokens = min(tokens, max(4096, (max_batch + 1) * max_context))
                engine_kwargs = {"max_running_requests": max_batch, **engine_kwargs}
            engine_kwargs = {"max_total_tokens": tokens, **engine_kwargs}
            mem_fraction_static = 0.9  # then SGLang's check only keeps a tenth of the free memory free
            engine_kwargs = {"attention_backend": "torch_native", **engine_kwargs}  # the one CPU backend in pure torch
        elif dev.index is not None:  # a torchrun rank's "cuda:<local rank>": its engine on that GPU
            engine_kwargs = {"base_gpu_id": dev.index, **engine_kwargs}
        self.frees_memory = dev.type != "cpu"  # the memory saver (torch_memory_saver) needs CUDA
        # an idle scheduler otherwise polls on a whole core, which the colocated trainer's update needs
        engine_kwargs = {"sleep_on_idle": True, **engine_kwargs}
        try:
            import sglang
        except ImportError as e:
            raise ImportError(f"SGLangEngine needs sglang=={SGLANG_VERSION}: build its environment with "
                              f"`bash scripts/sglang_env.sh DIR` and run DIR/bin/python: {e}") from None
        self._shm = _shm_files()
        # SGLang names its processes' sockets by files it makes in the temp folder and never removes (several a
        # start): they go in a folder of this engine's, its processes' temp folder too, removed at shutdown. And its
        # scheduler forms a process group of its own: under torchrun, TORCHELASTIC_USE_AGENT_STORE would send that
        # rendezvous to torchrun's agent store, where it waits forever.
        self._tmp = tempfile.mkdtemp(prefix="cleaner-sglang-")
        saved_tmpdir, saved_env = tempfile.tempdir, {k: os.environ.pop(k, None)
                                                     for k in ("TMPDIR", "TORCHELASTIC_USE_AGENT_STORE")}
        tempfile.tempdir = os.environ["TMPDIR"] = self._tmp
        try:
            self._engine = sglang.Engine(model_path=model_path, dtype=dtype, mem_fraction_static=mem_fraction_static,
                                         random_seed=seed, tp_size=tp_size, device=dev.type,
                                         enable_memory_saver=self.frees_memory,
                                         enable_deterministic_inference=deterministic, **engine_kwargs)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)  # no engine: no shutdown to remove it
            raise
        finally:
            tempfile.tempdir = saved_tmpdir
            os.environ.pop("TMPDIR")
            os.environ.update({k: v for k, v in saved_env.items() if v is not None})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-loop", daemon=True)
        self._thread.start()
        self._engine.loop = _LoopProxy(self._loop)

    async def _agenerate(self, **kw) -> dict:
        """One generate request on the engine's own loop (in-process) or over HTTP."""
        if self._engine is None:
            body = {k: v for k, v in kw.items() if v is not None}
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._request, "/generate", body)
        fut = asyncio.run_coroutine_threadsafe(
            self._engine.async_generate(input_ids=kw["input_ids"], sampling_params=kw["sampling_params"],
                                        return_logprob=True, logprob_start_len=kw.get("logprob_start_len")),
            self._loop)
        return await asyncio.wrap_future(fut)

    async def generate(self, input_ids: list[int], params: SamplingParams) -> GenOutput:
        check_params(params)
        if params.max_new_tokens == 0:
            return GenOutput([], [], "length")
        out = await self._agenerate(input_ids=list(map(int, input_ids)), return_logprob=True,
                                    sampling_params=sglang_sampling_params(params, self.extra_stop))
        return sglang_gen_output(out)

    async def score(self, input_ids: list[int], start: int) -> list[float]:
        ids = list(map(int, input_ids))
        check_score_start(ids, start)
        if start == len(ids):
            return []
        # one throw-away sampled token keeps this on SGLang's ordinary prefill path
        out = await self._agenerate(input_ids=ids, return_logprob=True, logprob_start_len=start - 1,
                                    sampling_params={"max_new_tokens": 1, "temperature": 1.0})
        return sglang_scores(out, ids, start)

    def update_weights(self, named_tensors, bucket_bytes: int = 1 << 30) -> None:
        """Push (HF name, tensor) pairs in buckets of ~bucket_bytes, inside the weight-update session SGLang
        requires (begin_weight_update ... end_weight_update, closed even when a push fails), then flush the
        radix cache (its KV was computed by the old weights)."""
        self._control("begin_weight_update")
        try:
            bucket, size = [], 0
            for name, t in named_tensors:
                bucket.append((name, t.detach()))
                size += t.numel() * t.element_size()
                if size >= bucket_bytes:
                    self._push(bucket)
                    bucket, size = [], 0
            if bucket:
                self._push(bucket)
        finally:
            self._control("end_weight_update")
        self.flush_cache()

    def _push(self, bucket):
        if self._engine is not None:
            ok, msg = self._engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
        else:
            import torch.multiprocessing as tmp
            from sglang.srt.utils import MultiprocessingSerializer
            # tensors travel as shared-memory handles: CUDA IPC on a GPU; on the CPU a file in /dev/shm by name
            # (file_system), since the default strategy passes descriptors only a child of ours can receive
            strategy = tmp.get_sharing_strategy()
            tmp.set_sharing_strategy("file_system")
            try:  # CPU tensors are copied first, or the trainer's own storage would move into shared memory
                payload = MultiprocessingSerializer.serialize(
                    [(n, t.clone() if t.device.type == "cpu" else t) for n, t in bucket], output_str=True)
            finally:
                tmp.set_sharing_strategy(strategy)
            r = self._request("/update_weights_from_tensor", {"serialized_named_tensors": [payload] * self.tp_size,
                                                             "flush_cache": False})
            ok, msg = r["success"], r["message"]
        if not ok:
            raise RuntimeError(f"SGLang update_weights_from_tensor failed: {msg}")

    def _control(self, op: str) -> None:
        """A control call that answers (success, message): begin/end_weight_update."""
        if self._engine is not None:
            ok, msg = getattr(self._engine, op)()
        else:  # a refusal comes back as HTTP 400, raised by _request
            ok, msg = True, self._request("/" + op, {})
        if not ok:
            raise RuntimeError(f"SGLang {op} failed: {msg}")

    def flush_cache(self, wait_s: float = 30.0) -> None:
        """Drop the radix cache. SGLang refuses while a request is still in its scheduler, which a request
        that has just answered may briefly be: retried for up to wait_s."""
        deadline = time.monotonic() + wait_s
        while True:
            if self._engine is not None:
                r = self._engine.flush_cache()
                ok, msg = r.success, r.message
            else:
                try:  # a refusal comes back as HTTP 400
                    ok, msg = True, self._request("/flush_cache", {})
                except RuntimeError as e:
                    ok, msg = False, str(e)
            if ok:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang flush_cache refused for {wait_s:g} s (requests still running?): {msg}")
            time.sleep(0.05)

    def release_memory(self) -> None:
        if not self.frees_memory:
            return
        if self._engine is not None:
            self._engine.release_memory_occupation()
        else:
            self._request("/release_memory_occupation", {})

    def resume_memory(self) -> None:
        if not self.frees_memory:
            return
        if self._engine is not None:
            self._engine.resume_memory_occupation()
        else:
            self._request("/resume_memory_occupation", {})

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._engine = None
            _remove_orphan_shm(self._shm)
            _reap_children()
            shutil.rmtree(self._tmp, ignore_errors=True)
            _detach_resource_tracker()
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def _request(self, route: str, body: dict | None):
        """POST body as JSON (GET when body is None) to the server; returns the parsed JSON (or None for a
        plain-text reply)."""
        import json
        import urllib.error
        import urllib.request
        req = urllib.request.Request(self._url + route, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"SGLang server {self._url}{route}: HTTP {e.code}: "
                               f"{e.read()[:500].decode(errors='replace')}") from None
        try:
            return json.loads(raw)
        except ValueError:
            return None


# What SGLang's processes leave in /dev/shm when shutdown SIGKILLs them: load-snapshot slots, SGLang's pid-stamped
# segments, the CPU all-reduce buffer of its compiled kernels.
_SGLANG_SHM = ("sglang_loads_", "sgl_shm_", "deepspeed_allreduce_buffer_")


def _cpu_kv_tokens(model_path: str, dtype: str, share: float) -> int:
    """The KV-cache tokens that fit a CPU engine's share of the machine's memory, less its weights."""
    import json
    from pathlib import Path
    c = json.loads((Path(model_path) / "config.json").read_text())
    c = c.get("text_config", c)
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    per_token = 2 * c["num_hidden_layers"] * c.get("num_key_value_heads", heads) * head_dim  # K and V, each layer
    per_token *= 4 if dtype == "float32" else 2
    weights = sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors"))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(4096, int(total * share - weights) // per_token)


def _shm_files() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _remove_orphan_shm(before: set[str]) -> None:
    """Unlink what SGLang's killed processes left in /dev/shm since `before`: SGLang's own files, and the named
    semaphores of multiprocessing that no live process of ours has open (kill_process_tree also kills the resource
    tracker that would have unlinked them; one this process still maps is its own, unlinked at its exit)."""
    try:  # by inode: glibc maps a new semaphore under a temporary name, then links it to its own
        with open("/proc/self/maps") as f:
            mapped = {int(x[4]) for x in map(str.split, f) if len(x) > 5 and x[5].startswith("/dev/shm/")}
    except OSError:
        mapped = set()
    for name in _shm_files() - before:
        path = os.path.join("/dev/shm", name)
        try:
            if name.startswith(_SGLANG_SHM) or (name.startswith("sem.mp-") and os.stat(path).st_ino not in mapped):
                os.unlink(path)
        except OSError:
            pass


def _detach_resource_tracker() -> None:
    """SGLang's shutdown kills every child of this process, multiprocessing's resource tracker among them (and
    again at exit). A semaphore this process still holds unlinks itself when released, and tells the tracker
    to forget it; a relaunched tracker, which never saw the name, would print a KeyError traceback for each.
    So the tracker's pipe now ends in a thread of ours that reads and drops (what the killed processes left in
    /dev/shm, _remove_orphan_shm has removed)."""
    from multiprocessing import resource_tracker
    tracker = resource_tracker._resource_tracker
    r, w = os.pipe()
    threading.Thread(target=lambda: all(iter(lambda: os.read(r, 4096), b"")), name="resource-sink", daemon=True).start()
    with tracker._lock:
        if tracker._fd is not None:
            os.close(tracker._fd)
        tracker._fd, tracker._pid = w, None


def _reap_children(wait_s: float = 10.0) -> None:
    """Collect the exit status of this process's children that kill_process_tree left as zombies, again while
    reaping turns up more, for at most wait_s: no process of the engine's outlives shutdown, not even in the
    process table."""
    import psutil  # an SGLang dependency
    deadline = time.monotonic() + wait_s
    while True:
        zombies = []
        for child in psutil.Process().children():
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    zombies.append(child.pid)
            except psutil.NoSuchProcess:
                pass
        for pid in zombies:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not zombies or time.monotonic() > deadline:
            return
