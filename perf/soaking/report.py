"""The soak's report and its judgement of growth: RSS by the peaks of two windows (rss_peaks),
open fds and /dev/shm between the two quiescent samples (growth_table); the table.md that
sums up the requests, the samples and the growth."""
import json
from collections import Counter

from servers import markdown_row
from .tally import Tally, server_successes

RSS_GROWTH = 0.05  # of the peak after warm-up, per process


def rss_peaks(samples: list[dict], warm: dict, label: str) -> tuple[float, float]:
    """A process's highest RSS (MiB) in the window that starts with the warm sample, and in the
    window that ends with the last sample; each window holds as many samples as the warm-up.

    Under this mix the front's RSS swings between samples, quiescent ones too, by more than the
    growth allowed (perf/findings/2026-11-soak.md): the JSON of a 1 MiB tensor leaves the
    allocator holding pages for a while. A leak lifts every later sample, so it lifts the later
    peak; the swing does not."""
    start = next(i for i, s in enumerate(samples) if s is warm)
    width = max(start, 1)
    pid = warm["procs"][label]["pid"]

    def peak(window):
        return max(s["procs"][label]["rss_mib"] for s in window
                   if s["procs"].get(label, {}).get("pid") == pid)
    return peak(samples[start:start + width]), peak(samples[-width:])


def growth_table(samples: list[dict], warm: dict, end: dict, errors: list[str]) -> str:
    rows = [markdown_row(["process", "pid", "peak RSS MiB after warm-up → at the end", "growth",
                          "fds warm → end"]),
            markdown_row(["---"] * 5)]
    for label in sorted(warm["procs"].keys() | end["procs"].keys()):
        w, e = warm["procs"].get(label), end["procs"].get(label)
        if w is None or e is None or w["pid"] != e["pid"]:
            errors.append(f"process {label}: {w and w['pid']} at warm-up, {e and e['pid']} at the end")
            continue
        early, late = rss_peaks(samples, warm, label)
        grew = (late - early) / early
        if grew >= RSS_GROWTH:
            errors.append(f"{label}: peak RSS grew {grew:+.1%} ({early:.1f} → {late:.1f} MiB)")
        if e["fds"] > w["fds"]:
            errors.append(f"{label}: open fds {w['fds']} → {e['fds']}")
        rows.append(markdown_row([label, str(e["pid"]), f"{early:.1f} → {late:.1f}",
                                  f"{grew:+.2%}", f"{w['fds']} → {e['fds']}"]))
    ws, es = warm["shm"], end["shm"]
    for key in ("segments", "bytes", "allocated"):
        if es[key] > ws[key]:
            errors.append(f"/dev/shm {key}: {ws[key]} → {es[key]}")
    rows.append(markdown_row(["/dev/shm shmserve.*", "", f"segments {ws['segments']} → {es['segments']}",
                              f"bytes {ws['bytes']} → {es['bytes']}",
                              f"allocated {ws['allocated']} → {es['allocated']}"]))
    return "\n".join(rows)


def sample_line(s: dict) -> str:
    procs = s["procs"].values()
    return (f"| {s['tag']} | {s['t_s']:.0f} | {len(s['procs'])} | {sum(p['rss_mib'] for p in procs):.1f} | "
            f"{s['procs'].get('front', {}).get('rss_mib', 0):.1f} | {sum(p['fds'] for p in procs)} | "
            f"{s['shm']['segments']} | {s['shm']['allocated'] / 2**20:.1f} | "
            f"{sum(s['metrics']['success'].values())} | {sum(s['metrics']['failure'].values())} |")


def report(args, tally: Tally, samples: list[dict], warm: dict, end: dict, errors: list[str],
           log_lines: dict) -> str:
    lines = [f"# Soak: {args.minutes:g} min of mixed traffic on model_repository/", "",
             "| kind | sent | served |", "|---|---|---|"]
    lines += [f"| {k} | {tally.sent[k]} | {tally.served[k]} |" for k in sorted(tally.sent)]
    lost = sum(tally.sent.values()) - sum(tally.served.values())
    lines += ["", f"requests served: {sum(tally.served.values())}; lost (sent − correctly answered): {lost}",
              f"server's nv_inference_request_success at the end: {sum(end['metrics']['success'].values())} "
              f"(expected {server_successes(tally)}: ensemble requests count their two steps too, "
              f"iterative requests each of their decode steps)",
              "errors by kind: " + (", ".join(f"{k} × {n}" for k, n in sorted(tally.errors.items())) or "none"),
              "server failures by reason (metrics): " + (json.dumps(end["metrics"]["failure"])), "",
              "## Samples", "",
              "| sample | t s | processes | RSS MiB all | RSS MiB front | fds all | shm segments | shm MiB allocated "
              "| server successes | server failures |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [sample_line(s) for s in samples]
    lines += ["", f"## Growth: from the warm-up (t = {warm['t_s']:.0f} s) to the end "
              f"(t = {end['t_s']:.0f} s)", "",
              f"Flat: peak RSS growth < {RSS_GROWTH:.0%} per process (see rss_peaks), no new fd "
              f"between the quiescent samples, no new /dev/shm segment or byte.", "",
              growth_table(samples, warm, end, errors), "",
              f"server log: {log_lines['E']} error lines, {log_lines['W']} warning lines"]
    return "\n".join(lines)


def log_levels(path) -> dict:
    counts = Counter(line[:1] for line in path.read_text(errors="replace").splitlines())
    return {"E": counts["E"], "W": counts["W"]}

