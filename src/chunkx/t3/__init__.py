"""Tucker tensor trains: derivative jets of probes, apply and entries, their transposes as chunked
pipelines, and a Gauss-Newton operator."""

from ._dense import binomial_combine_tensor as binomial_combine_tensor
from ._dense import dense_probe_derivatives as dense_probe_derivatives
from ._estimate import estimate_chunk_size as estimate_chunk_size
from ._estimate import max_chunk_size_within as max_chunk_size_within
from ._format import TuckerTensorTrain as TuckerTensorTrain
from ._forward import t3_apply_derivatives as t3_apply_derivatives
from ._forward import t3_entries_derivatives as t3_entries_derivatives
from ._forward import t3_probe_derivatives as t3_probe_derivatives
from ._forward import tv_apply_derivatives as tv_apply_derivatives
from ._forward import tv_entries_derivatives as tv_entries_derivatives
from ._forward import tv_probe_derivatives as tv_probe_derivatives
from ._gauss_newton import GaussNewton as GaussNewton
from ._transpose import (
    t3_apply_corewise_derivatives_transpose as t3_apply_corewise_derivatives_transpose,
)
from ._transpose import (
    t3_entries_corewise_derivatives_transpose as t3_entries_corewise_derivatives_transpose,
)
from ._transpose import (
    t3_probe_corewise_derivatives_transpose as t3_probe_corewise_derivatives_transpose,
)
from ._transpose import tv_apply_derivatives_transpose as tv_apply_derivatives_transpose
from ._transpose import tv_entries_derivatives_transpose as tv_entries_derivatives_transpose
from ._transpose import tv_probe_derivatives_transpose as tv_probe_derivatives_transpose
