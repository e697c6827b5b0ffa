"""Training the runs: claims (one trainer per run, across the nodes that share an out_dir), starting train.py
for a run and finishing it (done.json, or why it failed), and the Runner that keeps `parallel` of them going."""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

import torch

from ablation.estimate import eta
from ablation.files import TRAIN_PY
from ablation.grid import ablate_command, run_args
from ablation.runs import SUMMARY_VERSION, summarize_run
from common.files import write_json
from common.progress import fmt_duration
from common.threads import use_threads

CLAIM_STALE_S = 600  # a claim whose owner stopped refreshing it this long ago is free


# ----------------------------------------------------------------------------- claims: one trainer per run

def claim(path):
    """Claim a run for this process (a file beside its directory, written whole before it appears), or say
    who holds it. A claim whose owner died (on this host), or stopped refreshing it (any host), is taken over
    by one process only: the first to rename it aside."""
    claim_path, me = path + '.claim', {'host': socket.gethostname(), 'pid': os.getpid()}
    mine = f'{claim_path}.{me["host"]}.{me["pid"]}'
    with open(mine, 'w') as f:
        json.dump(me, f)
    try:
        for _ in range(2):
            try:
                os.link(mine, claim_path)  # atomic: fails if a claim is there, never shows it half-written
                return None
            except FileExistsError:
                pass
            try:
                with open(claim_path) as f:
                    owner = json.load(f)
                age = time.time() - os.path.getmtime(claim_path)
            except (OSError, ValueError):  # gone meanwhile, or damaged: look again
                owner, age = {}, CLAIM_STALE_S + 1
            alive = owner.get('host') == me['host'] and _alive(owner.get('pid'))
            if not (owner.get('host') == me['host'] and not alive or age > CLAIM_STALE_S):
                return f"{owner.get('host')}:{owner.get('pid')}"
            try:  # stale: of all the processes that see it so, the one whose rename succeeds removes it
                os.rename(claim_path, f'{mine}.stale')
                os.remove(f'{mine}.stale')
            except FileNotFoundError:
                pass
        return 'another process'
    finally:
        os.remove(mine)


def take(path):
    """Claim a run to train it: None, or why it is not ours to train ('finished', or who is training it)."""
    done = os.path.join(path, 'done.json')
    if os.path.exists(done):
        return 'finished'
    holder = claim(path)
    if holder:
        return f'being trained by {holder}'
    # ours now; but a train.py may still run there, or another process may have finished the run between the look
    # above and the claim (start() would delete it)
    why = ('being trained by a train.py still running there' if trainer_inside(path) else
           'finished' if os.path.exists(done) else None)
    if why:
        release(path)
    return why


def trainer_inside(path):
    """Whether a train.py holds the run directory's lock (an orphan of a process that died without taking its
    runs with it, on a system where they do not die together)."""
    import fcntl
    try:
        fd = os.open(os.path.join(path, '.lock'), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def refresh(path):
    """Tell other nodes this run's claim is alive (its mtime); False if it was taken over meanwhile."""
    try:
        os.utime(path + '.claim')
        return True
    except FileNotFoundError:
        return False


def _alive(pid):
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def release(path):
    try:
        os.remove(path + '.claim')
    except FileNotFoundError:
        pass


# ----------------------------------------------------------------------------- one run: start and finish

def _die_with_parent():
    """In a child: be killed when ablate.py dies, even by kill -9, so no orphan trains on (Linux)."""
    try:
        import ctypes
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(flags, seed, path, cwd, device, settings, threads):
    """Start train.py for one run in a fresh directory, with `threads` intra-op threads; (process, log file)."""
    shutil.rmtree(path, ignore_errors=True)  # a half-finished run restarts from scratch (we hold its claim)
    os.makedirs(path)
    env = {**os.environ, 'PYTHONUNBUFFERED': '1', 'OMP_NUM_THREADS': str(threads)}
    log = open(os.path.join(path, 'train.log'), 'w')
    cmd = [settings['python'] or sys.executable, TRAIN_PY, *run_args(flags, seed, settings), f'--out_dir={path}']
    cmd += [f'--device={device}'] if device else []
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=_die_with_parent if sys.platform.startswith('linux') else None)
    return proc, log


def finish(job, proc, log, duration, cwd, settings, loads=()):
    """'' when the run finished (done.json written; a diverged run counts), else why it failed. loads: the
    machine's load averages sampled while it ran (the report says when they exceeded the cores)."""
    log.close()
    try:
        return _finish(job, proc, duration, cwd, settings, loads)
    except FileNotFoundError as e:  # its folder was deleted while it ran: that run alone failed
        return f"(exit {proc.returncode}): its folder went away while it ran ('{e.filename}' is missing)"
    except (Exception, SystemExit) as e:  # its summary could not be made (e.g. a checkpoint this code cannot read,
        # which the loader reports as one line and an exit): that run alone failed, its files kept, the grid goes on
        what = f"{type(e).__name__}: {e}" if isinstance(e, Exception) else 'the error line above'
        return f"(exit {proc.returncode}): its summary failed: {what}"


def _finish(job, proc, duration, cwd, settings, loads=()):
    name, flags, seed, path = job
    log_path = os.path.join(path, 'train.log')
    diverged = proc.returncode == 1 and os.path.exists(os.path.join(path, 'diverged.json'))
    if (proc.returncode != 0 and not diverged) or not os.path.exists(os.path.join(path, 'log.jsonl')):
        with open(log_path, errors='replace') as f:
            lines = [line.strip() for line in f if line.strip()]
        why = ([line for line in lines if line.startswith('error:')] or lines or ['(no output)'])[-1][:300]
        return f"(exit {proc.returncode}): {why}; see {log_path}"
    write_json(os.path.join(path, 'done.json'), {'variant': name, 'flags': flags, 'seed': seed,
                                                  'args': run_args(flags, seed, settings), 'command': ablate_command(),
                                                  'duration_s': round(duration, 1), **load_figures(loads),
                                                  **summarize_run(path, cwd), 'version': SUMMARY_VERSION})
    return ''


def load_figures(loads):
    """The mean load average while a run ran (one taken now if none was sampled) and the cores it had."""
    loads = list(loads) or ([os.getloadavg()[0]] if hasattr(os, 'getloadavg') else [])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    return {'load_avg': round(statistics.mean(loads), 2), 'cores': cores} if loads else {}


# ----------------------------------------------------------------------------- the runner

def run_threads(threads, parallel):
    """(each run's intra-op threads, why in words): its OMP_NUM_THREADS, which train.py's threads=0 takes. threads,
    or for 0 ablate.py's own count on a CPU (common.threads: the usable cores, or OMP_NUM_THREADS where set), shared out
    among the parallel runs, at least 1 each: torch's default would give every run every core."""
    if threads:
        return threads, '--threads'
    said = use_threads(0, 'cpu')  # ablate.py's own (the length table, the probes) and the share's total
    return max(1, torch.get_num_threads() // parallel), f"of {said}" + (
        f", shared out among {parallel} runs at once" if parallel > 1 else '')


class Runner:
    """Trains the jobs ((name, flags, seed, path) each, in order), `parallel` at once, each on the least busy of the
    devices' slots; a run finished or claimed by another process is skipped, saying so."""

    def __init__(self, jobs, cwd, settings, estimates=None):
        self.jobs, self.cwd, self.settings, self.parallel = jobs, cwd, settings, settings['parallel']
        self.estimates, self.finished = estimates or {}, []  # {path: seconds} (ablation.estimate); paths done
        self.slots = [d.strip() for d in settings['devices'].split(',') if d.strip()] or [None]
        self.total, self.counter, self.running = len(jobs), 0, {}
        self.durations, self.failed, self.busy = [], [], []
        self.threads, self.threads_why = run_threads(settings['threads'], self.parallel)
        self.threads_said, self.sampled = False, 0.0

    def run(self):
        """(failed, busy): the runs that failed ('<variant> seed <seed>'), and (that name, path) of the runs another
        process was training. Interrupted, it stops the runs it started and keeps what finished."""
        last_refresh = time.time()
        try:
            while self.jobs or self.running:
                self.start_free_slots()
                time.sleep(0.2)
                self.collect()
                self.sample_load()
                if time.time() - last_refresh > 60:  # keep the claims fresh for other nodes
                    last_refresh = time.time()
                    for job, *_ in self.running.values():
                        refresh(job[3])
        finally:
            for proc, (job, log, *_) in self.running.items():  # interrupted: stop the runs, keep what finished
                proc.terminate()
                proc.wait()
                log.close()
                release(job[3])
        return self.failed, self.busy

    def sample_load(self, every=5.0):
        """The 1-minute load average, every few seconds, into each running run's list."""
        if hasattr(os, 'getloadavg') and time.time() - self.sampled >= every:
            self.sampled, load = time.time(), os.getloadavg()[0]
            for entry in self.running.values():
                entry[5].append(load)

    def start_free_slots(self):
        """Start the next jobs while fewer than `parallel` run; a job not ours to train is skipped."""
        while self.jobs and len(self.running) < self.parallel:
            job = self.jobs.popleft()
            self.counter += 1
            name, flags, seed, path = job
            label = f"[{self.counter}/{self.total}] {name} seed {seed}"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            why = take(path)
            if why:
                print(f"{label} skipped ({why})", flush=True)
                if why != 'finished':
                    self.busy.append((f'{name} seed {seed}', path))
                continue
            in_use = [r[3] for r in self.running.values()]
            device = min(self.slots, key=in_use.count)  # the least busy (None: the recipe's own)
            if not self.threads_said:
                print(f"each run: {self.threads} thread{'s' if self.threads > 1 else ''} ({self.threads_why})",
                      flush=True)
                self.threads_said = True
            proc, log = start(flags, seed, path, self.cwd, device, self.settings, self.threads)
            self.running[proc] = (job, log, time.time(), device, label, [])
            print(f"{label} started{f' on {device}' if device else ''}", flush=True)

    def collect(self):
        """Finish the runs whose train.py ended (done.json, or why it failed), each a line with the ETA."""
        for proc in [p for p in self.running if p.poll() is not None]:
            job, log, t0, device, label, loads = self.running.pop(proc)
            why = finish(job, proc, log, time.time() - t0, self.cwd, self.settings, loads)
            release(job[3])
            if why:
                self.failed.append(f'{job[0]} seed {job[2]}')
            else:
                self.durations.append(time.time() - t0)  # failures are quick: they would shrink the ETA
                self.finished.append(job[3])
            left = [j[3] for j in self.jobs] + [r[0][3] for r in self.running.values()]
            seconds = eta(self.estimates, self.finished, self.durations, left, self.parallel) if self.estimates \
                else statistics.mean(self.durations or [0]) * len(left) / self.parallel
            eta_text = f", ETA {fmt_duration(seconds)}" if left and self.durations else ''
            print(f"{label} " + (f"FAILED {why}" if why else f"done in {fmt_duration(self.durations[-1])}") + eta_text,
                  flush=True)
