"""The table ``experiments/gpu_bench.py`` prints at the end of a run, from its JSON."""
from __future__ import annotations






def print_table(result: dict) -> None:
    parts = result["parts"]
    lines = ["", "gsplit GPU benchmark: " + " | ".join(
        f"{k} {parts.get('system', {}).get(k)}" for k in ("device", "gpu", "driver", "kernel"))]
    rows = [dict(r, system=r["system"] + (" bf16" if part == "train_bf16" else "")) for part in ("train", "train_bf16")
            for r in parts.get(part, {}).get("rows", [])]
    if rows:
        lines.append(f"{'system':14s} {'targets':>7s} {'fanouts':>9s} {'ms/it':>8s} {'floor':>7s} {'x floor':>7s} "
                     f"{'sample':>7s} {'feature':>7s} {'layers':>7s} {'GPU busy':>8s} {'peak GiB':>8s} status")
        for r in rows:
            f = r.get("floor", {})

            def num(v, fmt="8.2f"):
                return format(v, fmt) if isinstance(v, (int, float)) else format("-", ">" + fmt.split(".")[0])
            lines.append(f"{r['system']:14s} {r['targets']:7d} {r['fanouts']:>9s} {num(r.get('ms_per_iteration'))} "
                         f"{num(f.get('total_ms'), '7.2f')} {num(r.get('over_floor'), '7.1f')} "
                         f"{num(f.get('sample_ms'), '7.2f')} {num(f.get('feature_ms'), '7.2f')} "
                         f"{num(f.get('layers_ms'), '7.2f')} {num(r.get('gpu_busy_share'), '8.0%')} "
                         f"{num(r.get('peak_device_GiB'), '8.2f')} {r['status']}")
    start = parts.get("gpu_start", {})
    for run in ("cold_cache", "warm_cache"):
        if "phases" in start.get(run, {}):
            phases = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in start[run]["phases"].items())
            lines.append(f"GPU start, {run.replace('_', ' ')}: {start[run]['total_s']:.2f} s ({phases}); "
                         f"process with imports {start[run]['process_s']:.1f} s")
    first = parts.get("first_iteration", {}).get("rows", [])
    if first:
        lines.append("")
        lines.append(f"{'first iteration':16s} {'system':10s} {'setup s':>8s} {'to 1st it s':>11s} status")
        for r in first:
            lines.append(f"{r['source']:16s} {r['system']:10s} {r.get('setup_s', float('nan')):8.2f} "
                         f"{r.get('first_iteration_s', float('nan')):11.2f} {r['status']}")
    for key, tag in (("full_graph", ""), ("full_graph_bf16", " bf16")):
        full = parts.get(key, {})
        if "gsplit" in full:
            lines.append("")
            for who in ("gsplit", "pyg"):
                r = full.get(who, {})
                lines.append(f"full graph{tag} {who:6s} {full['nodes']:,} vertices: "
                             f"{r.get('ms_per_epoch', float('nan')):.1f} ms/epoch, "
                             f"peak {r.get('peak_device_GiB', float('nan')):.2f} GiB ({r.get('status')})")
    macro = [r for r in parts.get("macrobatch", {}).get("rows", []) if "ms_per_iteration" in r]
    if macro:
        lines.append("")
        lines.append("macrobatch: system, B, ms/iteration, load ms/iteration, input rows/iteration, host MB/iteration")
        for r in macro:
            lines.append(f"  {r['system']:6s} {r['macrobatch']:3d} {r['ms_per_iteration']:8.2f} {r['load_ms']:8.2f} "
                         f"{r['input_rows_per_iteration']:12.0f} {r['host_MB_per_iteration']:9.2f}")
    probe = parts.get("pin_probe", {})
    if probe.get("rows"):
        lines.append("")
        how = "cudaHostRegister" if probe.get("backend") == "cuda" else "long-term pin by io_uring (no GPU)"
        lines.append(f"{how} of {probe['MiB']} MiB: kind, flags, seconds, anon/file RSS growth MiB, "
                     "pins taken, pages migrated, status, top kernel stack")
        for r in probe["rows"]:
            rss = r.get("rss_delta_MiB", {})
            vm = r.get("vmstat_delta", {})
            stack = r.get("top_stacks") or [["", 0]]
            lines.append(f"  {r.get('kind', ''):22s} {r.get('flags', ''):9s} {str(r.get('register_s', '')):>8.8s} "
                         f"{rss.get('RssAnon', 0):7.0f} {rss.get('RssFile', 0):7.0f} "
                         f"{vm.get('nr_foll_pin_acquired', 0):9d} {vm.get('pgmigrate_success', 0):7d} "
                         f"{r.get('error') or r.get('status', '')} {stack[0][0][:90]}")
    for name, part in parts.items():
        if isinstance(part, dict) and ("error" in part or str(part.get("status", "")).startswith("not run")):
            lines.append(f"{name}: {part.get('error') or part.get('status')}")
    print("\n".join(lines), flush=True)
