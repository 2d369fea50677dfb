"""KVConnectorFactory as vLLM 0.26's: a registry of connectors by name
(register_connector, get_connector_class_by_name: what MultiConnector uses to
rebuild a child's stats that crossed processes), and get_connector_class:
import kv_connector_module_path (it wins over the registry), take class
kv_connector, require a constructor that accepts kv_cache_config; construct
cls(vllm_config, role, kv_cache_config)."""
import importlib
import inspect

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class KVConnectorFactory:
    _registry = {}

    @classmethod
    def register_connector(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")
        cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)

    @classmethod
    def get_connector_class_by_name(cls, connector_name):
        if connector_name not in cls._registry:
            raise ValueError(f"Connector '{connector_name}' is not registered.")
        return cls._registry[connector_name]()

    @classmethod
    def get_connector_class(cls, kv_transfer_config):
        name, path = kv_transfer_config.kv_connector, kv_transfer_config.kv_connector_module_path
        if path:
            c = getattr(importlib.import_module(path), name)
            if "kv_cache_config" not in inspect.signature(c.__init__).parameters:
                raise ValueError(f"Connector {c.__name__} uses deprecated 2-argument constructor signature.")
        elif name in cls._registry:
            c = cls._registry[name]()
        else:
            raise ValueError(f"Unsupported connector type: {name}")
        if not (isinstance(c, type) and issubclass(c, KVConnectorBase_V1)):
            raise ValueError(f"{c} is not a subclass of KVConnectorBase_V1")
        return c

    @classmethod
    def create_connector(cls, config, role, kv_cache_config=None):
        return cls.get_connector_class(config.kv_transfer_config)(config, role, kv_cache_config)
