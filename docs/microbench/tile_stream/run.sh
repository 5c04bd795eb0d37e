#!/usr/bin/env bash
# One core streaming q4 weights through the 1-row and the 5-row tile's loop, and through
# edited copies of the 5-row loop (what each edit removes or changes: docs/kernels.md, "The
# verify tile against DRAM"). Needs gcc and an AVX-512 VNNI + GFNI x86-64 CPU.
#     bash docs/microbench/tile_stream/run.sh          (from the repository's root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
variant() {  # name, rows (1 or 5), sed program applied to the loop
    local src="$here/loop$2.s"
    sed -E "$3" "$src" > "$tmp/$1.s"
    python3 "$here/wrap.py" "$tmp/$1.s" "$tmp/$1.S" "$2"
    gcc -O2 "$here/stream.c" "$tmp/$1.S" -o "$tmp/$1" -z noexecstack
    printf '%-34s %s\n' "$1" "$("$tmp/$1" 3 | awk '{print $1}' | tr '\n' ' ')GB/s"
}
variant "1-row tile" 1 's/^$//'
variant "5-row tile" 5 's/^$//'
variant "5-row, loads and prefetches only" 5 '/vpdpbusd|vcvtdq2ps|vmulps|vfmadd|vpandq|vgf2p8|vpaddd|vpbroadcastd|vpmovzx|vpslld/d'
variant "5-row without its dots" 5 '/vpdpbusd/d'
variant "5-row without the float epilogue" 5 '/vcvtdq2ps|vmulps|vfmadd/d'
variant "5-row without prefetches" 5 '/prefetch/d'
variant "5-row, prefetchnta" 5 's/prefetcht1/prefetchnta/'
variant "5-row, every other line prefetched" 5 '/prefetcht1\t-(192|64)\(%r8\)/d'
variant "5-row, weights from L1 (prefetch on)" 5 's/vmovdqu64\t-8([0-9]{3})\(%r8\)/vmovdqu64\t\1(%rcx)/'
variant "5-row, displacement-only dots" 5 's/\(%r10,%r14\)/(%r14)/g; s/\(%rcx,%r11,8\)/(%rcx)/g'
