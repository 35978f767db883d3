"""The report: one table row per case and server, and a line per server naming the cases that
stalled a normal request, killed or hung it, or made its memory grow."""
from servers import markdown_row
from .probe import STALL_MS


GROWTH_MIB = 50         # the summary's threshold for peak and retained growth


def summary(records: list[dict]) -> dict:
    stalled = [r["case"] for r in records if (r["probe"]["max_ms"] or 0) > STALL_MS]
    return dict(stalled=stalled, died=[r["case"] for r in records if r["died"]],
                hung=[r["case"] for r in records if r["hung"]],
                retained_over_50=[r["case"] for r in records if (r["retained_mib"] or 0) > GROWTH_MIB],
                memory_growth=[r["case"] for r in records if (r["peak_growth_mib"] or 0) > GROWTH_MIB])


def mib_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}".replace("-0", "0") if abs(value) >= 0.5 else "0"


def table(results: dict[str, list[dict]]) -> str:
    """One row per case and server; then a summary line per server."""
    lines = [markdown_row(("case", "server", "answer", "probe max (p99) ms", f"probes > {STALL_MS} ms",
                           "peak +MiB", "retained +MiB", "died")),
             markdown_row(("---",) * 3 + ("---:",) * 4 + ("---",))]
    names = list(results)
    order = list(dict.fromkeys(r["case"] for recs in results.values() for r in recs))
    for case in order:
        for name in names:
            for r in results[name]:
                if r["case"] != case:
                    continue
                p = r["probe"]
                answer = r["answer"].replace("|", "/").replace("\n", " ")
                lines.append(markdown_row((
                    case, name, answer[:160] + ("…" if len(answer) > 160 else ""),
                    f"{p['max_ms']:.0f} ({p['p99_ms']:.0f})" if p["max_ms"] is not None else "–",
                    "none" if not p["over_stall"] else f"**{p['over_stall']} of {p['n']}**",
                    mib_text(r["peak_growth_mib"]), mib_text(r["retained_mib"]),
                    ("**died**" if r["died"] else "**hung**" if r["hung"] else "no")
                    + (" (restarted)" if r.get("restarted") == "retained over 1 GiB" else ""))))
    lines.append("")
    for name in names:
        s = summary(results[name])
        lines.append(f"- **{name}**: stalled a normal request past {STALL_MS} ms in {len(s['stalled'])} of "
                     f"{len(results[name])} cases ({', '.join(s['stalled']) or 'none'}); died in "
                     f"{len(s['died'])} ({', '.join(s['died']) or 'none'})"
                     + (f", hung in {len(s['hung'])} ({', '.join(s['hung'])})" if s["hung"] else "")
                     + f"; retained > {GROWTH_MIB} MiB in {len(s['retained_over_50'])} "
                     f"({', '.join(s['retained_over_50']) or 'none'}); memory-growth cases (peak > "
                     f"{GROWTH_MIB} MiB): {len(s['memory_growth'])} ({', '.join(s['memory_growth']) or 'none'})")
    return "\n".join(lines)
