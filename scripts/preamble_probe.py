"""How a content-free first line moves ``p_hard``: the shipped sanity suite's hard requests scored
alone and behind each of ``PREAMBLES`` ("Hello there. <request>"), as the service scores them.

    python scripts/preamble_probe.py [--model SPEC] [--threshold 0.45] [--preamble TEXT ...] [--pairs-out FILE]

Prints, per preamble, the mean ``p_hard`` change of the hard requests and the share of them at or above
``--threshold`` (the default policy's ``p_hard_frontier``: the frontier's share). ``--pairs-out`` writes
the suite with the same preamble before both sides of each pair (round-robin over them), for
``pointsman evaluate --pairs FILE``: a difficulty model's ranking should not depend on a greeting.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from pointsman.estimator.head_inputs import instruction_end
from pointsman.estimator.model_source import load_estimator
from pointsman.training.sanity import read_pairs, score_request

PREAMBLES = ("Hi! I have a question.\n", "Hello there. ", "Thanks in advance!\n", "Question: ",
             "Context: we are a small team.\n\nQuestion: ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled")
    ap.add_argument("--threshold", type=float, default=0.45)
    ap.add_argument("--preamble", action="append", help="a preamble to probe (repeatable; default: PREAMBLES; "
                    "a literal \\n is a line break)")
    ap.add_argument("--pairs-out")
    args = ap.parse_args()
    est = load_estimator(None if args.model == "bundled" else args.model)
    preambles = tuple(p.replace("\\n", "\n") for p in args.preamble) if args.preamble else PREAMBLES
    hard = [p.hard for p in read_pairs("sanity") if isinstance(p.hard, str)]

    def p_hard(text: str) -> float:
        return score_request(est, text)

    alone = np.array([p_hard(t) for t in hard])
    print(f"{len(hard)} hard requests of the sanity suite, model {args.model}, threshold {args.threshold}")
    print(f"  {'alone':46} mean p_hard {alone.mean():.3f}  at/above threshold {np.mean(alone >= args.threshold):.1%}")
    for pre in preambles:
        with_pre = np.array([p_hard(pre + t) for t in hard])
        # the requests whose instruction (``head_inputs.instruction_end``) would be the preamble alone
        cut = np.array([0 < instruction_end(pre + t) <= len(pre) for t in hard])
        print(f"  {pre!r:46} mean change {np.mean(with_pre - alone):+.3f}  at/above threshold "
              f"{np.mean(with_pre >= args.threshold):.1%}  | cut at the preamble: {int(cut.sum())} requests, "
              f"mean change {np.mean((with_pre - alone)[cut]) if cut.any() else 0.0:+.3f}, at/above threshold "
              f"{np.mean(alone[cut] >= args.threshold) if cut.any() else 0.0:.1%} -> "
              f"{np.mean(with_pre[cut] >= args.threshold) if cut.any() else 0.0:.1%}")
    if args.pairs_out:
        with open(args.pairs_out, "w", encoding="utf-8") as out:
            for i, pair in enumerate(p for p in read_pairs("sanity") if isinstance(p.hard, str) and isinstance(p.easy, str)):
                pre = preambles[i % len(preambles)]
                out.write(json.dumps({"id": f"{pair.id}-pre", "category": pair.category, "lang": "en",
                                      "easy": pre + pair.easy, "hard": pre + pair.hard}) + "\n")


if __name__ == "__main__":
    main()
