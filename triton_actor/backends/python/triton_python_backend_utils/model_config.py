"""Model configuration helpers: ``ModelConfig`` (what ``auto_complete_config`` gets) and the lookups
``get_input_config_by_name``, ``get_output_config_by_name`` and
``using_decoupled_model_transaction_policy``.

Owner: ``ModelConfig`` wraps the config dict the server passes to ``auto_complete_config`` (on the
instance's native thread, under the backends' import lock) and edits it in place; the server reads
the dict back afterwards. Failure: a change that contradicts the config raises ``ValueError`` with
the text Triton's python backend uses, so the load fails with the same reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import _ArgTypeError


def _config_dict(model_config: Any) -> Mapping[str, Any]:
    """Accept a config dict or a ``ModelConfig``."""
    if isinstance(model_config, ModelConfig):
        return model_config.as_dict()
    return model_config


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict | None:
    """Return the ``input`` entry called ``name`` of a config dict, or None."""
    for entry in _config_dict(model_config).get("input") or ():
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict | None:
    """Return the ``output`` entry called ``name`` of a config dict, or None."""
    for entry in _config_dict(model_config).get("output") or ():
        if entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Return True if the config sets ``model_transaction_policy.decoupled``."""
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    """Auto-complete helper wrapping a model config dict (as parsed from Triton's JSON)."""

    _INPUT_KEYS = ("name", "data_type", "dims", "optional")
    _OUTPUT_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        if isinstance(model_config, (str, bytes, bytearray)):
            model_config = json.loads(model_config)
        if not isinstance(model_config, dict):
            raise _ArgTypeError(
                f"ModelConfig expects a JSON string or a dict, got {type(model_config).__name__}"
            )
        self._model_config = model_config

    def as_dict(self) -> dict[str, Any]:
        """Return the wrapped config dict (not a copy)."""
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; ValueError if the config already has a larger value."""
        current = self._model_config.get("max_batch_size", 0) or 0
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Enable dynamic batching; ValueError if another scheduler is configured."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to "
                    "set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name()
        if not isinstance(tensor, Mapping):
            raise TypeError(
                f"{kind} in auto-complete-config function for model '{model}' must be a "
                f"dict, got {type(tensor).__name__}"
            )
        label = tensor.get("name", "")
        for key in tensor:
            if key not in allowed:
                quoted = [f"'{k}'" for k in allowed]
                names = ", ".join(quoted[:-1]) + " and " + quoted[-1]
                raise ValueError(
                    f"{kind} '{label}' in auto-complete-config function for model "
                    f"'{model}' contains property other than {names}."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{model}' is missing "
                "'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{label}' in auto-complete-config function for model "
                    f"'{model}' is missing '{key}' property."
                )
        entries = self._model_config.setdefault(kind, [])
        for current in entries:
            if current.get("name") != label:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type not in ("TYPE_INVALID", "", None) and (
                current_type != tensor["data_type"]
            ):
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype "
                    f"{current_type} for {kind} '{label}', model provides "
                    f"{tensor['data_type']}"
                )
            current_dims = current.get("dims")
            if current_dims and list(current_dims) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', tensor '{label}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(current_dims)}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{model}', tensor '{label}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        entries.append(tensor)

    def add_input(self, input: dict[str, Any]) -> None:
        """Add (or merge into) a config input: keys name, data_type, dims[, optional]."""
        self._add_tensor("input", input, self._INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add (or merge into) a config output: keys name, data_type, dims."""
        self._add_tensor("output", output, self._OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only ``decoupled``); no changing a set value."""
        model = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{model}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{model}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

