"""A model without noise is unchanged by issue 21 (noise in the language): the generated sources of
every library model — the torch core, the Triton kernels and the C++ kernels, with and without
`detach_reset`, and the recurrent layers' torch and Triton scans — are byte for byte those of the
code before noise existed.

The reference is `tests/fixtures/noise_free_sources.json`: the SHA-256 of each source, recorded by
this module's `sources()` run on main at commit a990aec (before the change; the model file is named
`<stem>.neuron`, so no path of the machine enters a source; the Triton recurrent scans re-recorded
after their deliberate change in issue 20, fixed-point products and resident tiles, which touched no
other source). If another change to code generation is intended, regenerate the fixture
deliberately: `python tests/test_noise_free_code.py --write`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "noise_free_sources.json"


def sources() -> dict[str, str]:
    """name -> SHA-256 of every generated source of every library model."""
    import flexdsl
    from flexdsl.backends.torch.recurrent import emit_recurrent as torch_recurrent
    from flexdsl.backends.triton.recurrent import emit_recurrent as triton_recurrent
    from flexdsl.runtime.compiler import compile_text

    def sha(s: str) -> str:
        return hashlib.sha256(s.encode()).hexdigest()

    out = {}
    root = Path(flexdsl.__file__).resolve().parent.parent / "neurons"
    for path in sorted(root.glob("*.neuron")):
        text = path.read_text()
        for detach in (False, True):
            c = compile_text(text, f"{path.stem}.neuron", detach)
            for b in ("torch", "triton", "cpu"):
                out[f"{path.stem}/{b}/{'detach' if detach else 'plain'}"] = sha(c.artefact(b).source)
        c = compile_text(text, f"{path.stem}.neuron", False)
        out[f"{path.stem}/torch-recurrent"] = sha(torch_recurrent(c)[0])
        out[f"{path.stem}/triton-recurrent"] = sha(triton_recurrent(c, 0, 0)[0])
    return out


def test_generated_code_of_models_without_noise_is_unchanged():
    want = json.loads(FIXTURE.read_text())["sha256"]
    got = sources()
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    changed = sorted(k for k in want if got[k] != want[k])
    assert not changed, (f"generated code changed for {changed}; if intended (not by noise), regenerate the "
                         "fixture: python tests/test_noise_free_code.py --write")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    FIXTURE.write_text(json.dumps({
        "about": "SHA-256 of the generated sources of every library model without noise (tests/test_noise_free_code.py)",
        "recorded_from": "main at a990aec (after issue 19), before noise (issue 21); Triton kernels after c24c; the Triton recurrent scans after issue 20 session 4 (fixed-point products, resident tiles); the models added in issue 37 (snn_rleaky, snn_rleaky_zero, snn_rsynaptic, norse_lif_recurrent) recorded when added, every earlier entry unchanged",
        "sha256": sources()}, indent=1, sort_keys=True) + "\n")
