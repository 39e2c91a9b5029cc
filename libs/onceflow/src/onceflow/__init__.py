"""onceflow's shared core: the pieces every service is built from.

`onceflow.v1`, the generated wire contracts, comes from the onceflow-wire package (a client
needs it without the core): the package's path reaches into every `onceflow` folder."""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
