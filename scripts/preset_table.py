"""Print the presets table of docs/predict.md: gpurig's parameters and forward FLOPs beside the published ones.

    .venv/bin/python scripts/preset_table.py
"""

from gpurig.models import PRESETS, model_spec


def main() -> None:
    print("| preset | input per sample | parameters | published | forward GFLOPs / sample | published | "
          "backward / forward | layers |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for preset in PRESETS.values():
        spec = model_spec(preset.name, batch=preset.min_batch)   # per-sample numbers: the batch cancels
        published = f"{preset.published_gflops:.4g}" if preset.published_gflops else "—"
        parameters = f"{preset.published_parameters:,}" if preset.published_parameters else "—"
        print(f"| {preset.name} | {preset.describes} | {spec.parameters:,} | {parameters} | "
              f"{spec.forward_flops_per_sample / 1e9:.4g} | {published} | "
              f"{spec.backward_flops / spec.forward_flops:.2f} | {len(spec.layers)} |")


if __name__ == "__main__":
    main()
