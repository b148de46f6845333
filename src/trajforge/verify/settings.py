"""The verification layer's section of the run's configuration: the row check's time and the judge.

trajforge.config collects it into RunConfig. The judge's endpoint defaults to the run's model and
its key lookup (model/endpoint.py; verify/judge.py resolves it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trajforge.fields import shown


class VerifySection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    check_timeout: float = Field(300.0, gt=0, description="seconds a row's check command may run")
    judge_model: str | None = Field(None, min_length=1, description="model grading rows that have a rubric",
                                    json_schema_extra=shown("the run's --model"))
    judge_base_url: str | None = Field(None, min_length=1,
                                       description="OpenAI-compatible API base URL of the judge model",
                                       json_schema_extra=shown("the run's --base_url"))
    judge_api_key_env: str | None = Field(None, min_length=1,
                                          description="environment variable holding the judge endpoint's API key",
                                          json_schema_extra=shown("the run's key lookup"))
    judge_threshold: float = Field(0.5, ge=0, le=1,
                                   description="a rubric passes when the judge's score (0..1) is at least this")
