"""Regenerate the domain data kept in the repo (calibration text and the KB eval set).

The data is synthetic but shaped like a manufacturer's maintenance knowledge base:
passages with an id that state exact process parameters. Calibration passages and eval
passages are drawn from disjoint machine lists, so no eval item leaks into calibration.
Run: python scripts/make_domain_data.py  (deterministic; the output is committed).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CALIBRATION_MACHINES = [
    "CNC lathe L-200",
    "hydraulic press HP-80",
    "injection molder IM-350",
    "spot welder SW-12",
    "band saw BS-40",
    "surface grinder SG-6",
    "paint booth PB-3",
    "conveyor line CL-9",
    "air compressor AC-75",
    "laser cutter LC-4",
    "robotic arm RA-6",
    "heat-treat furnace HF-2",
]
EVAL_MACHINES = [
    "milling center MC-500",
    "stamping press SP-250",
    "extruder EX-90",
    "reflow oven RO-7",
    "boring mill BM-3",
    "die caster DC-400",
    "pick-and-place PP-11",
    "chiller CH-30",
    "gear hobber GH-8",
    "wave solder WS-5",
]
# (parameter, unit, low, high, step, sentence template)
PARAMETERS = [
    (
        "spindle bolt torque",
        "N·m",
        40,
        120,
        5,
        "Tighten the {m} spindle bolts to {v} {u} in a star pattern.",
    ),
    (
        "hydraulic oil change interval",
        "hours",
        1000,
        4000,
        250,
        "Change the hydraulic oil of the {m} every {v} {u} of operation.",
    ),
    (
        "coolant concentration",
        "%",
        4,
        10,
        1,
        "Keep the coolant concentration of the {m} at {v} {u}, checked with a refractometer.",
    ),
    (
        "lubrication pressure",
        "bar",
        2,
        8,
        1,
        "Set the central lubrication pressure of the {m} to {v} {u}.",
    ),
    (
        "belt tension deflection",
        "mm",
        5,
        15,
        1,
        "The drive belt of the {m} must deflect {v} {u} under thumb pressure.",
    ),
    (
        "barrel zone 1 temperature",
        "°C",
        180,
        260,
        5,
        "Heat barrel zone 1 of the {m} to {v} {u} before purging.",
    ),
    ("air supply pressure", "bar", 5, 8, 1, "Supply the {m} with dry air at {v} {u}."),
    (
        "filter replacement interval",
        "days",
        30,
        180,
        15,
        "Replace the intake filter of the {m} every {v} {u}.",
    ),
    (
        "maximum vibration velocity",
        "mm/s",
        2,
        11,
        1,
        "Stop the {m} if the bearing vibration exceeds {v} {u} RMS.",
    ),
    (
        "gearbox oil volume",
        "L",
        4,
        40,
        2,
        "Fill the gearbox of the {m} with {v} {u} of ISO VG 220 oil.",
    ),
]
FILLER = [
    "Lock out and tag out the main disconnect before opening any guard.",
    "Record the work in the maintenance log with the technician's badge number.",
    "Wear cut-resistant gloves and safety glasses during this task.",
    "Inspect the area for leaks and loose fasteners after the work is done.",
    "Only trained maintenance staff may perform this procedure.",
]


def passage(rng: random.Random, machine: str, param: tuple) -> tuple[str, int]:
    name, unit, low, high, step, template = param
    value = rng.randrange(low, high + 1, step)
    sentences = [template.format(m=machine, v=value, u=unit)]
    sentences += rng.sample(FILLER, 2)
    rng.shuffle(sentences)
    return " ".join(sentences), value


def main() -> None:
    rng = random.Random(20261130)
    calibration = []
    for machine in CALIBRATION_MACHINES:
        for param in PARAMETERS:
            text, _ = passage(rng, machine, param)
            calibration.append({"text": f"Maintenance procedure for the {machine}. {text}"})
    rng.shuffle(calibration)
    out = ROOT / "calibration" / "manufacturing_maintenance.jsonl"
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in calibration))

    items = []
    for i, machine in enumerate(EVAL_MACHINES):
        # 8 items per machine, 80 in all: the smallest set whose 0.05 drop gates can be
        # decided at 95% (stats.detectable_drop(80) == 0.05; 40 items resolve only 0.10).
        for j, param in enumerate(rng.sample(PARAMETERS, 8)):
            text, value = passage(rng, machine, param)
            pid = f"KB-{1000 + i * 10 + j}"
            items.append(
                {
                    "id": f"mkb-{len(items) + 1:03d}",
                    "passage_id": pid,
                    "passage": text,
                    "question": f"What is the {param[0]} for the {machine}?",
                    "answer": f"{value} {param[1]}",
                    "tags": tags_for(param[0]),
                }
            )
    write_jsonl(ROOT / "eval_sets" / "manufacturing_kb" / "data.jsonl", items)

    # Refusal: the passage covers one parameter, the question asks for another.
    refusals = []
    for i, machine in enumerate(EVAL_MACHINES):
        # 4 per machine, 40 in all: resolves the set's 0.10 margin (stats.detectable_drop).
        for k, (stated, asked) in enumerate(rng.sample(PARAMETERS, 2) for _ in range(4)):
            text, _ = passage(rng, machine, stated)
            refusals.append(
                {
                    "id": f"ref-{len(refusals) + 1:03d}",
                    "passage_id": f"KB-{2000 + i * 10 + k}",
                    "passage": text,
                    "question": f"What is the {asked[0]} for the {machine}?",
                    "answer": "The passage does not state it.",
                    "tags": tags_for(asked[0]),
                }
            )
    write_jsonl(ROOT / "eval_sets" / "refusal_kb" / "data.jsonl", refusals)
    print(
        f"{len(calibration)} calibration passages, {len(items)} KB items, "
        f"{len(refusals)} refusal items"
    )


SAFETY = {
    "spindle bolt torque",
    "barrel zone 1 temperature",
    "maximum vibration velocity",
    "lubrication pressure",
}


def tags_for(parameter: str) -> list[str]:
    tags = [parameter.split()[-1]]
    if parameter in SAFETY:
        tags.append("safety")
    return tags


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


if __name__ == "__main__":
    main()
