"""The noisy test models of tests/test_noise.py, shared with bench/noise_cuda_check.py (the same
models on a GPU): each model's text, and the input scale that makes it spike.
"""

NLIF = """neuron NoisyLIF:
    input x
    param tau = 2.0
    param sigma = 0.3 learnable
    param v_threshold = 1.0
    state v = 0.0
    update:
        v = v + (x - v) / tau + sigma * randn()
    spike when v >= v_threshold
    on spike:
        v = 0.0
"""

OU = """neuron OU:
    input x
    param dt = 0.1
    param tau = 10.0 learnable
    param sigma = 1.0 learnable
    state v = 0.0
    equations:
        dv/dt = (x - v)/tau + sigma*sqrt(2/tau)*xi
"""

LIF_EM = """neuron NoisyLIFUnits:
    input I : nA
    param dt = 0.1 ms "integration step"
    param tau_m = 10 ms
    param R = 10 Mohm
    param v_rest = -70 mV
    param v_th = -50 mV
    param sigma = 3 mV learnable "noise amplitude"
    state v = v_rest
    equations method euler:
        dv/dt = (v_rest - v + R*I)/tau_m + sigma*sqrt(2/tau_m)*xi
    spike when v > v_th surrogate sigmoid(alpha=1/mV)
    on spike:
        v = v_rest
"""

GBM = """neuron GBM:
    input x
    param dt = 0.01
    param mu = 0.5
    param s = 0.8 learnable
    state X = 1.0
    equations method {method}:
        dX/dt = mu*X + x + s*X*xi
"""

ESCAPE = """neuron Escape:
    input x
    param tau = 4.0
    param rho = 0.3 learnable
    param delta = 0.5
    state v = 0.0
    update:
        v = v + (x - v) / tau
        let p = 1 - exp(-rho * exp((v - 1) / delta))
    spike when rand() < p
    on spike:
        v = 0.0
"""

TWO = """neuron TwoSources:
    input x
    param dt = 0.5
    param tau_m = 10.0
    param tau_s = 5.0
    param sigma_v = 0.5 learnable
    param sigma_s = 1.0
    state v = 0.0
    state I = 0.0
    equations method heun:
        dv/dt = (I + x - v)/tau_m + sigma_v*sqrt(2/tau_m)*xi_v
        dI/dt = -I/tau_s + sigma_s*sqrt(2/tau_s)*xi_s
    spike when v > 1.0
    on spike:
        v = 0.0
"""

REFRACTORY = """neuron NoisyRefractory:
    input x
    param dt = 0.1
    param tau = 5.0
    param sigma = 0.4 learnable
    state v = 0.0
    refractory 0.5
    equations:
        dv/dt = (x - v)/tau + sigma*sqrt(2/tau)*xi unless refractory
    spike when v > 1.0
    on spike:
        v = 0.0
"""

MODELS = {"nlif": NLIF, "ou": OU, "lif_em": LIF_EM, "gbm_milstein": GBM.format(method="milstein"),
          "gbm_heun": GBM.format(method="heun"), "gbm_euler": GBM.format(method="euler"), "escape": ESCAPE,
          "two_sources": TWO, "refractory": REFRACTORY}
SCALE = {"lif_em": 2.5, "gbm_milstein": 0.1, "gbm_heun": 0.1, "gbm_euler": 0.1}
