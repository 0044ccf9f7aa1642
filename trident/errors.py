"""Trident's one error hierarchy. Messages say what was expected, what came, and what to do."""


class TridentError(RuntimeError):
    """Base class of every error Trident raises on purpose."""


class CaptureError(TridentError):
    """The function could not be captured into an FX graph of Triton launches and ATen ops.

    data_dependent: True when the trace failed because the function decides something from a
    tensor's values (a size from nonzero, a branch or a Triton constexpr on `.item()`): one graph
    cannot hold that, Dynamo's graph breaks can (Note [Data-dependent calls through Dynamo]).
    new_object: True when the function returns an object it made during the call that holds
    tensors (a library's own Cache built from the one passed in): a capture cannot make that
    object again per call, Dynamo can (the same Note).
    module_state: True when the function changes state it keeps outside its arguments (a tensor
    attribute of a module that it reads, a counter, a list it appends to, on a module, a plain
    object or a global): a capture would not change it per call, Dynamo does (Note [Module
    attributes a trace rebinds]).
    """

    def __init__(self, message: str, *, data_dependent: bool = False, new_object: bool = False,
                 module_state: bool = False):
        super().__init__(message)
        self.data_dependent = data_dependent
        self.new_object = new_object
        self.module_state = module_state


class UnsupportedError(TridentError):
    """The graph uses something Trident does not handle (yet); the message says what.
    data_dependent: as CaptureError's (a pass needed a size only the data gives)."""

    def __init__(self, message: str, *, data_dependent: bool = False):
        super().__init__(message)
        self.data_dependent = data_dependent


class LoweringError(TridentError):
    """The MLIR pipeline failed; the message names the saved input and the repro command."""


class LaunchError(TridentError):
    """A kernel could not be launched or an SCM could not run on the given inputs."""


class OperatorError(TridentError):
    """An operator inside a region failed, as it would have eagerly: the message is the
    operator's own (where eager would raise it), then the region and operator it ran in. The
    operator's error is the __cause__. Also a RuntimeError, as eager's is."""

    def __init__(self, message: str, *, region: str = "", operator: str = ""):
        super().__init__(message)
        self.region = region
        self.operator = operator


class KnobError(TridentError, ValueError):
    """A TRIDENT_* variable holds a value its knob cannot parse (also a ValueError, as before)."""


class GuardError(TridentError):
    """Inputs differ from the captured graph in a way no new specialization can serve.

    region: the region whose guards failed before it ran any step, or None;
    before_effects: True when nothing of the call had run (a front door may serve it otherwise);
    traced_value: True when a value the trace specialized differs (Note [Values a trace
    specializes]): another capture of the same signature may serve the call.
    """

    def __init__(self, message: str, *, region: "str | None" = None, before_effects: bool = False,
                 traced_value: bool = False):
        super().__init__(message)
        self.region = region
        self.before_effects = before_effects
        self.traced_value = traced_value
