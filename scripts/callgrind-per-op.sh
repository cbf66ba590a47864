# Sourced by callgrind.sh and callgrind-capi.sh: the one way they count.
# The caller defines `cmd NAME ITERATIONS`, which sets the array CMD to the
# command that runs NAME that many times; `per_op TITLE NAME...` prints,
# for each NAME, the instructions and the locked read-modify-write
# instructions (atomics: callgrind's "global bus events", --collect-bus)
# per iteration. Each NAME runs at two iteration counts, LO and HI (default
# 1000 and 11000); the difference divided by the extra iterations cancels
# all set-up cost.

count() { # name iterations -> "instructions atomics" in all
    local out
    out=$(mktemp)
    cmd "$1" "$2"
    valgrind --tool=callgrind --collect-bus=yes --callgrind-out-file="$out" "${CMD[@]}" >/dev/null 2>&1
    awk '/^summary:/ {print $2, $3}' "$out"
    rm -f "$out"
}

per_op() { # title name...
    local title=$1 lo=${LO:-1000} hi=${HI:-11000} name ai ag bi bg
    shift
    printf '%-28s %12s %10s\n' "$title" instr/op atomics/op
    for name in "$@"; do
        read -r ai ag < <(count "$name" "$lo")
        read -r bi bg < <(count "$name" "$hi")
        printf '%-28s %12.1f %10.1f\n' "$name" "$(echo "($bi - $ai) / ($hi - $lo)" | bc -l)" \
            "$(echo "($bg - $ag) / ($hi - $lo)" | bc -l)"
    done
}
