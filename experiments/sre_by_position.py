"""Does self-recall error favour newer tokens at length? SRE of each step's candidates, by where the step falls.

At every select-and-evict step of every layer and K/V head, the SRE policy's scores are split
into the tokens leaving the window (fresh) and the tokens already in the sparse cache, and
reported by the quarter of the context the step falls in: the fresh tokens' mean score, the
cached tokens' median, and Spearman's rho between a candidate's position and its score. If the
key features drifting past the positions the feature maps were trained at made newer tokens
look harder to recall, the fresh tokens' scores would rise with the step's position.

    python experiments/sre_by_position.py --feature-maps smollm2-135m-instruct --lengths 2048 8192 --samples 2 --seed 1
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--feature-maps", required=True, help="a shipped name or a `lola linearize` folder")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="prompts other than the reported ones (seed 0)")
    args = parser.parse_args()

    from lola import models
    from lola.eval.niah_execution import niah_prompts
    from lola.eval.niah_spec import NiahRun, method_configs
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
    from lola.policies import register
    from lola.policies.builtin import SelfRecallError
    from lola.pretrained.folder import read_feature_maps

    records: list[tuple[int, float, float, float]] = []  # (step position, rho, fresh mean, cached median)

    class RecordedSRE(SelfRecallError):
        """SRE, recording row 0's scores at every step."""

        def score(self, candidates, ctx):
            scores = super().score(candidates, ctx)
            valid, pos, fresh = candidates.valid[0], candidates.pos[0].float(), ctx.fresh or 0
            for h in range(valid.shape[0]):
                if valid[h].sum() < 8:
                    continue
                x, p = scores[0, h][valid[h]].float(), pos[h][valid[h]]
                ranks = torch.stack([p.argsort().argsort(), x.argsort().argsort()]).float()
                new, old = scores[0, h, :fresh][valid[h, :fresh]], scores[0, h, fresh:][valid[h, fresh:]]
                records.append(
                    (
                        int(ctx.step[0]),
                        float(torch.corrcoef(ranks)[0, 1]),
                        float(new.float().mean()) if new.numel() else float("nan"),
                        float(old.float().median()) if old.numel() else float("nan"),
                    )
                )
            return scores

    register("sre_recorded", RecordedSRE, overwrite=True)
    model, tok = models.load(args.model)
    maps = read_feature_maps(args.feature_maps)
    for length in args.lengths:
        run = NiahRun(
            model=args.model, feature_maps=args.feature_maps, methods=["lola"], policies=["sre"], lengths=[length], samples=args.samples, seed=args.seed
        )
        ((_, cfg),) = method_configs(run).items()
        apply_lola(model, cfg.model_copy(update={"policy": "sre_recorded"}), feature_maps=maps)
        prompts = niah_prompts(run, tok)
        for (_, index), sample in sorted(prompts.items()):
            records.clear()
            with torch.no_grad():
                model(sample.input_ids, cache=LoLACache(model))
            r = torch.tensor(records)
            for q in range(4):
                lo, hi = q * length // 4, (q + 1) * length // 4
                part = r[(r[:, 0] >= lo) & (r[:, 0] < hi)]
                if len(part):
                    print(
                        f"{length} #{index} steps in {lo}-{hi}: fresh mean SRE {part[:, 2].nanmean():.3f}, cached median {part[:, 3].nanmean():.3f}, "
                        f"rho(position, SRE) {part[:, 1].mean():.3f} ({len(part)} layer-head-steps)",
                        flush=True,
                    )
        remove_lola(model)


if __name__ == "__main__":
    main()
