"""The runtime: running compiled models. Takes the pipeline's IR (`store.pipeline.IR`) and the
backends' programs; gives `Compiled` (`compiler.py`: the IR with its loaded programs and the
host-side values of a call), `NeuronModule` (`module.py`: the torch.nn.Module a model is loaded
as: params, states, checks at the API), the `check_finite` scan (`finite.py`) and the display
registry that `flexdsl.docs` fills (`display.py`)."""
