"""The GPU check kit's stages (scripts/gpu_check.sh): unit, bench, e2e."""
