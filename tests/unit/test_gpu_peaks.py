"""The published peaks table: its units and names, and settings that name a model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from aaco.analyzers.roofline import RooflineSettings
from aaco.contract.gpu_peaks import PEAKS, peaks_for
from aaco.contract.roofline import CEILINGS


def test_every_model_has_the_hbm_roof_and_only_names_the_roofline_knows():
    names = {"HBMBw", *CEILINGS.values()}
    for model, peaks in PEAKS.items():
        assert peaks["HBMBw"] > 0 and peaks["FP32Flops"] > 0, model
        assert set(peaks) <= names, model


def test_a_few_figures_as_the_vendors_print_them():
    assert peaks_for("MI300X")["MFMABF16Flops"] == 1307400.0  # 1,307.4 TF (CDNA 3 white paper)
    assert peaks_for("mi300x")["HBMBw"] == 5325.0  # 5.325 TB/s (footnote MI300-13)
    assert peaks_for("H100 SXM5")["MFMAF16Flops"] == 989400.0  # dense, white paper V1.04
    assert "MFMAF16Flops" not in peaks_for("H200-SXM")  # published with sparsity only
    assert peaks_for("A100") is None


def test_settings_take_a_model_or_peaks_and_refuse_an_unknown_model():
    s = RooflineSettings(peaks={"gfx942": "MI300X", "gfx90a": {"HBMBw": 1388.9, "FP32Flops": 20942.0}})
    assert s.peaks_of("gfx942") == PEAKS["MI300X"] and s.peaks_of("gfx90a")["HBMBw"] == 1388.9
    assert s.peaks_of("sm_90") is None
    with pytest.raises(ValidationError, match="no GPU model 'MI400' in the peaks table"):
        RooflineSettings(peaks={"gfx950": "MI400"})
