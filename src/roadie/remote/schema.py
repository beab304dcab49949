"""A remote action's parameter JSON Schema as a Pydantic model, so an event file is checked
against it exactly as against an in-process action's model: the same field-by-field errors,
at `roadie event validate` time and again when a run starts.

Each property becomes a field named by the property (its alias) and checked by the JSON
Schema validator against that property's schema; whatever the schema says about the object
as a whole (`required`, `additionalProperties`, `allOf`...) is checked too.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import jsonschema
from jsonschema.exceptions import SchemaError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from roadie.errors import RegistryError


def _validator_for(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise RegistryError(f"not a valid JSON Schema: {exc.message}") from exc
    return cls(schema)


class RemoteParams(BaseModel):
    """The base of every remote action's parameter model."""

    model_config = ConfigDict(extra="allow")
    json_schema: ClassVar[dict[str, Any]] = {}
    # Optional properties with no default in the schema: left out by the event, not sent
    # (a `null` would be a value the schema may refuse). Field name -> property name.
    unsent: ClassVar[dict[str, str]] = {}

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: Any) -> Any:
        dumped = handler(self)
        if not isinstance(dumped, dict):
            return dumped
        for field, prop in self.unsent.items():
            if field not in self.model_fields_set:
                dumped.pop(prop, None)
                dumped.pop(field, None)
        return dumped


def check_value_schema(lease_id: str, schema: dict[str, Any]) -> None:
    """Refuse a lease whose manifest gives its values a schema that is not one."""
    try:
        _validator_for(schema)
    except RegistryError as exc:
        raise RegistryError(f"{lease_id}: its value is {exc.message}") from exc


def params_model(action_id: str, schema: dict[str, Any]) -> type[BaseModel]:
    """The model of one remote action's parameters, from the JSON Schema its manifest gives."""
    if schema.get("type", "object") != "object":
        raise RegistryError(f"{action_id}: parameters must be a JSON object schema, not {schema.get('type')!r}")
    whole = _validator_for(schema)
    defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    required = set(schema.get("required", []))
    fields: dict[str, Any] = {}
    unsent: dict[str, str] = {}
    for index, (name, prop) in enumerate(dict(schema.get("properties", {})).items()):
        one = _validator_for({**defs, "type": "object", "properties": {"value": prop}})
        check = _check_property(one)
        has_default = isinstance(prop, dict) and "default" in prop
        default: Any = ... if name in required else prop["default"] if has_default else None
        if name not in required and not has_default:
            unsent[f"p{index}"] = name
        description = prop.get("description") if isinstance(prop, dict) else None
        fields[f"p{index}"] = (
            Annotated[Any, AfterValidator(check)],
            Field(default, alias=name, description=description),
        )
    extra: Literal["forbid", "allow"] = "forbid" if schema.get("additionalProperties") is False else "allow"

    def _whole_object(self: BaseModel) -> BaseModel:
        # What the fields cannot say alone: errors about the object itself.
        dumped = self.model_dump(mode="json", by_alias=True)
        for error in whole.iter_errors(dumped):
            if not error.path and error.validator not in ("required", "additionalProperties", "properties"):
                raise PydanticCustomError("json_schema", "{message}", {"message": error.message})
        return self

    validators: dict[str, Any] = {"_whole_object": model_validator(mode="after")(_whole_object)}
    model: type[BaseModel] = create_model(
        "Params_" + action_id.replace(".", "_"),
        __base__=RemoteParams,
        __validators__=validators,
        **fields,
    )
    model.model_config = ConfigDict(extra=extra, populate_by_name=False)
    model.model_rebuild(force=True)
    model.json_schema = schema
    model.unsent = unsent
    return model


def _check_property(validator: jsonschema.protocols.Validator) -> Any:
    def check(value: Any) -> Any:
        for error in validator.iter_errors({"value": value}):
            raise PydanticCustomError("json_schema", "{message}", {"message": error.message})
        return value

    return check
