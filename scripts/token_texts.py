"""Texts by category for measuring token counts against real tokenizers, and those tokenizers.

``CATEGORIES``: name -> ``make(rng, n_chars) -> str`` (deterministic for a seeded ``random.Random``;
about ``n_chars`` characters). Natural-language categories shuffle the sentences of the samples below
(written for this file); the others are generated (hex digests and dumps, base64, digits, emoji, DNA,
JSON records) or Python's own source (code).

``reference_tokenizers() -> {name: encode(text) -> int}``: the real tokenizers available offline (litellm
bundles OpenAI's o200k_base and cl100k_base as tiktoken cache files and Claude's and DeepSeek-V3's
``tokenizer.json``); {} when litellm, tiktoken or tokenizers is missing. For tests and measurements only.

Used by ``scripts/measure_token_counts.py`` and ``tests/estimator/test_cost_tokens.py``.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import random
import string
from collections.abc import Callable
from pathlib import Path

ENGLISH = """\
The committee met on Tuesday to review the budget for the coming year. Several members raised concerns about \
the rising cost of maintenance, which has nearly doubled since the last review. If you want to bake bread at \
home, start with a simple recipe that uses flour, water, salt and yeast. Knead the dough for about ten minutes, \
until it is smooth and elastic, then let it rise in a warm place. The history of the printing press shows how a \
single invention can change the way ideas spread across a continent. Before Gutenberg, books were copied by hand, \
which made them rare and expensive. Please summarize the following article in three bullet points and suggest a \
better title for it. Our servers were unavailable for forty minutes because a configuration change disabled the \
health checks of the load balancer. We have added a review step and an automatic rollback so that this cannot \
happen again. Photosynthesis converts light energy into chemical energy, storing it in the bonds of glucose. \
Can you explain the difference between a mortgage with a fixed rate and one with a variable rate? She walked \
along the river until the lights of the town disappeared behind the hills, and then she sat down to rest."""

THAI = """\
วันนี้อากาศดีมาก เราจึงตัดสินใจไปเดินเล่นที่สวนสาธารณะใกล้บ้าน \
คณะกรรมการได้ประชุมกันเมื่อวันอังคารเพื่อพิจารณางบประมาณสำหรับปีหน้า \
หากคุณต้องการอบขนมปังที่บ้าน ให้เริ่มจากสูตรง่ายๆ ที่ใช้แป้ง น้ำ เกลือ และยีสต์ \
ประวัติศาสตร์ของแท่นพิมพ์แสดงให้เห็นว่าสิ่งประดิษฐ์เพียงชิ้นเดียวสามารถเปลี่ยนแปลงวิธีการเผยแพร่ความคิดได้อย่างไร \
กรุณาสรุปบทความต่อไปนี้เป็นสามข้อ และเสนอชื่อเรื่องที่ดีกว่าเดิม \
เซิร์ฟเวอร์ของเราใช้งานไม่ได้เป็นเวลาสี่สิบนาที เพราะการเปลี่ยนแปลงการตั้งค่าทำให้ระบบตรวจสอบสถานะหยุดทำงาน \
การสังเคราะห์ด้วยแสงเปลี่ยนพลังงานแสงให้เป็นพลังงานเคมีที่เก็บไว้ในน้ำตาลกลูโคส \
คุณช่วยอธิบายความแตกต่างระหว่างสินเชื่อบ้านแบบอัตราดอกเบี้ยคงที่และแบบลอยตัวได้ไหม \
เธอเดินไปตามริมแม่น้ำจนกระทั่งแสงไฟของเมืองหายไปหลังเนินเขา แล้วจึงนั่งลงพักผ่อน"""

CHINESE = """\
委员会于星期二开会，审议了明年的预算。几位委员对不断上涨的维护费用表示担忧，自上次审查以来，这项费用几乎翻了一番。\
如果你想在家里烤面包，可以从一个简单的配方开始，只需要面粉、水、盐和酵母。把面团揉大约十分钟，直到它变得光滑有弹性，\
然后放在温暖的地方发酵。印刷术的历史表明，一项发明就能改变思想在整个大陆传播的方式。请用三个要点总结下面这篇文章，\
并为它建议一个更好的标题。由于一次配置更改关闭了负载均衡器的健康检查，我们的服务器有四十分钟无法使用。\
我们增加了审核步骤和自动回滚，以确保这种情况不会再次发生。光合作用把光能转化为化学能，并储存在葡萄糖的化学键中。\
你能解释一下固定利率抵押贷款和浮动利率抵押贷款之间的区别吗？她沿着河边走着，直到小镇的灯光消失在山丘后面，才坐下来休息。"""

JAPANESE = """\
委員会は火曜日に集まり、来年度の予算について検討しました。何人かの委員は、前回の見直し以降ほぼ二倍になった維持費の増加に\
懸念を示しました。家でパンを焼きたいなら、小麦粉、水、塩、イーストを使う簡単なレシピから始めましょう。生地を十分ほどこねて、\
なめらかで弾力が出たら、暖かい場所で発酵させます。活版印刷の歴史は、一つの発明が大陸全体に考えが広がる方法を変えうることを\
示しています。次の記事を三つの箇条書きで要約し、よりよいタイトルを提案してください。設定の変更によってロードバランサーの\
ヘルスチェックが無効になったため、サーバーが四十分間利用できませんでした。このようなことが二度と起こらないように、\
レビューの手順と自動ロールバックを追加しました。固定金利の住宅ローンと変動金利の住宅ローンの違いを説明してもらえますか。\
彼女は町の明かりが丘の向こうに見えなくなるまで川沿いを歩き、それから腰を下ろして休みました。"""

KOREAN = """\
위원회는 화요일에 모여 내년 예산을 검토했습니다. 몇몇 위원들은 지난 검토 이후 거의 두 배로 늘어난 유지 보수 비용에 대해 \
우려를 나타냈습니다. 집에서 빵을 굽고 싶다면 밀가루, 물, 소금, 효모를 사용하는 간단한 조리법부터 시작하세요. 반죽을 약 10분 \
동안 매끄럽고 탄력이 생길 때까지 치댄 다음 따뜻한 곳에서 부풀게 두세요. 인쇄기의 역사는 하나의 발명이 생각이 대륙 전체로 \
퍼지는 방식을 어떻게 바꿀 수 있는지 보여 줍니다. 다음 기사를 세 가지 요점으로 요약하고 더 나은 제목을 제안해 주세요. 설정 \
변경으로 부하 분산 장치의 상태 확인이 비활성화되어 서버를 40분 동안 사용할 수 없었습니다. 이런 일이 다시 일어나지 않도록 \
검토 단계와 자동 롤백을 추가했습니다. 고정 금리 주택 담보 대출과 변동 금리 주택 담보 대출의 차이를 설명해 주시겠어요? \
그녀는 마을의 불빛이 언덕 뒤로 사라질 때까지 강을 따라 걸은 뒤 앉아서 쉬었습니다."""

RUSSIAN = """\
Комитет собрался во вторник, чтобы рассмотреть бюджет на следующий год. Несколько членов комитета выразили \
обеспокоенность ростом расходов на обслуживание, которые почти удвоились с момента последней проверки. Если вы \
хотите испечь хлеб дома, начните с простого рецепта из муки, воды, соли и дрожжей. Месите тесто около десяти \
минут, пока оно не станет гладким и эластичным, а затем оставьте его подниматься в тёплом месте. История \
книгопечатания показывает, как одно изобретение может изменить способ распространения идей по всему континенту. \
Пожалуйста, кратко изложите следующую статью в трёх пунктах и предложите для неё лучшее название. Наши серверы \
были недоступны сорок минут, потому что изменение конфигурации отключило проверки состояния балансировщика \
нагрузки. Можете ли вы объяснить разницу между ипотекой с фиксированной и с плавающей ставкой? Она шла вдоль \
реки, пока огни города не скрылись за холмами, а потом села отдохнуть."""

ARABIC = """\
اجتمعت اللجنة يوم الثلاثاء لمراجعة ميزانية العام المقبل. وأبدى عدد من الأعضاء قلقهم من ارتفاع تكاليف الصيانة التي \
تضاعفت تقريبا منذ المراجعة الأخيرة. إذا كنت تريد خبز الخبز في المنزل، فابدأ بوصفة بسيطة تستخدم الدقيق والماء والملح \
والخميرة. اعجن العجين لمدة عشر دقائق تقريبا حتى يصبح ناعما ومرنا، ثم اتركه ليختمر في مكان دافئ. يبين تاريخ الطباعة \
كيف يمكن لاختراع واحد أن يغير طريقة انتشار الأفكار في قارة بأكملها. يرجى تلخيص المقال التالي في ثلاث نقاط واقتراح عنوان \
أفضل له. كانت خوادمنا غير متاحة لمدة أربعين دقيقة لأن تغييرا في الإعدادات عطل فحوصات الحالة لموازن التحميل. هل يمكنك \
شرح الفرق بين الرهن العقاري بسعر فائدة ثابت وبسعر فائدة متغير؟ مشت على طول النهر حتى اختفت أضواء المدينة خلف التلال، \
ثم جلست لتستريح."""

EUROPEAN = """\
Le comité s'est réuni mardi pour examiner le budget de l'année prochaine. Plusieurs membres se sont inquiétés \
de la hausse des coûts d'entretien, qui ont presque doublé depuis le dernier examen. Si vous voulez faire du pain \
à la maison, commencez par une recette simple à base de farine, d'eau, de sel et de levure. Der Ausschuss trat am \
Dienstag zusammen, um den Haushalt für das kommende Jahr zu prüfen. Unsere Server waren vierzig Minuten lang nicht \
erreichbar, weil eine Konfigurationsänderung die Zustandsprüfungen des Lastverteilers abgeschaltet hatte. Können \
Sie den Unterschied zwischen einer Hypothek mit festem und mit variablem Zinssatz erklären? La historia de la \
imprenta muestra cómo un solo invento puede cambiar la manera en que las ideas se difunden por todo un continente. \
Por favor, resume el siguiente artículo en tres puntos y sugiere un título mejor. Ella caminó a lo largo del río \
hasta que las luces del pueblo desaparecieron detrás de las colinas, y luego se sentó a descansar."""

EMOJI_RANGES = ((0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF), (0x2600, 0x26FF))


def _sentences(text: str, ends: str) -> list[str]:
    out, cur = [], ""
    for ch in text:
        cur += ch
        if ch in ends:
            out.append(cur)
            cur = ""
    return out + ([cur] if cur.strip() else [])


def _shuffled(sample: str, ends: str) -> Callable[[random.Random, int], str]:
    sentences = _sentences(sample, ends)

    def make(rng: random.Random, n: int) -> str:
        out, size = [], 0
        while size < n:
            s = rng.choice(sentences)
            out.append(s)
            size += len(s)
        return "".join(out)[:n]
    return make


def code(rng: random.Random, n: int) -> str:
    import json.decoder
    import textwrap
    src = inspect.getsource(json.decoder) + inspect.getsource(textwrap) + inspect.getsource(string)
    start = rng.randrange(len(src) // 2)
    return ((src[start:] + src) * (n // len(src) + 2))[:n]


def json_records(rng: random.Random, n: int) -> str:
    rows, size = [], 0
    while size < n:
        row = {"id": rng.getrandbits(32), "user": rng.choice(["alice", "bob", "carol", "dave"]) + str(rng.randint(1, 999)),
               "created_at": f"2026-0{rng.randint(1, 9)}-{rng.randint(10, 28)}T{rng.randint(10, 23)}:{rng.randint(10, 59)}:00Z",
               "score": round(rng.uniform(0, 100), 3), "tags": rng.sample(["api", "billing", "cache", "gpu", "latency", "ok"], 2),
               "active": rng.random() > 0.5, "note": rng.choice(_sentences(ENGLISH, ".?"))[:60].strip()}
        rows.append(row)
        size += len(json.dumps(row)) + 4
    pretty = rng.random() < 0.5
    return (json.dumps(rows, indent=2) if pretty else json.dumps(rows, separators=(",", ":")))[:n]


def hex_digests(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        h = f"{rng.getrandbits(256):064x}" if rng.random() < 0.5 else f"{rng.getrandbits(128):032x}"
        out.append(h + rng.choice([" ", "\n", ", "]))
        size += len(out[-1])
    return "".join(out)[:n]


def hex_run(rng: random.Random, n: int) -> str:
    return rng.randbytes(n // 2 + 1).hex()[:n]


def base64_lines(rng: random.Random, n: int) -> str:
    return base64.encodebytes(rng.randbytes(n * 3 // 4 + 3)).decode()[:n]


def base64_run(rng: random.Random, n: int) -> str:
    return base64.b64encode(rng.randbytes(n * 3 // 4 + 3)).decode()[:n]


def digits(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        out.append(str(rng.randint(0, 10 ** rng.randint(1, 12))) + rng.choice([" ", ", ", "\n", "."]))
        size += len(out[-1])
    return "".join(out)[:n]


def digit_run(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(n))


def _emoji(rng: random.Random) -> str:
    a, b = rng.choice(EMOJI_RANGES)
    return chr(rng.randint(a, b))


def emoji(rng: random.Random, n: int) -> str:
    return "".join(_emoji(rng) + (" " if rng.random() < 0.2 else "") for _ in range(n))[:n]


def emoji_in_text(rng: random.Random, n: int) -> str:
    words = _sentences(ENGLISH, " ")
    out, size = [], 0
    while size < n:
        out.append(rng.choice(words) if rng.random() < 0.6 else "".join(_emoji(rng) for _ in range(rng.randint(1, 3))) + " ")
        size += len(out[-1])
    return "".join(out)[:n]


def dna(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        out.append(">seq" + str(rng.randint(1, 9999)) + "\n" + "\n".join(
            "".join(rng.choice("ACGT") for _ in range(60)) for _ in range(rng.randint(2, 12))) + "\n")
        size += len(out[-1])
    return "".join(out)[:n]


def random_unicode(rng: random.Random, n: int) -> str:
    """Code points drawn from every plane in use (no surrogates), a space now and then."""
    out = []
    while len(out) < n:
        c = rng.choice((rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF), rng.randint(0x3000, 0x9FFF),
                        rng.randint(0xA000, 0xD7FF), rng.randint(0xE000, 0xFFFD), rng.randint(0x10000, 0x3FFFF)))
        out.append(chr(c))
    return "".join(out)


def mixed(rng: random.Random, n: int) -> str:
    parts = [m for k, m in CATEGORIES.items() if k not in ("mixed", "random unicode")]
    out, size = [], 0
    while size < n:
        out.append(rng.choice(parts)(rng, rng.randint(50, 400)) + "\n")
        size += len(out[-1])
    return "".join(out)[:n]


CATEGORIES: dict[str, Callable[[random.Random, int], str]] = {
    "english": _shuffled(ENGLISH, ".?"),
    "code": code,
    "json": json_records,
    "hex digests": hex_digests,
    "hex run": hex_run,
    "base64 lines": base64_lines,
    "base64 run": base64_run,
    "digits": digits,
    "digit run": digit_run,
    "emoji": emoji,
    "emoji in text": emoji_in_text,
    "dna": dna,
    "french german spanish": _shuffled(EUROPEAN, ".?"),
    "thai": _shuffled(THAI, " "),
    "chinese": _shuffled(CHINESE, "。，？"),
    "japanese": _shuffled(JAPANESE, "。、"),
    "korean": _shuffled(KOREAN, ".?"),
    "russian": _shuffled(RUSSIAN, ".?"),
    "arabic": _shuffled(ARABIC, ".،؟"),
    "mixed": mixed,
    "random unicode": random_unicode,
}


def reference_tokenizers() -> dict[str, Callable[[str], int]]:
    """name -> token count of a text (no special tokens) for each real tokenizer available offline."""
    try:
        import litellm
        import tiktoken
        from tokenizers import Tokenizer
    except ImportError:
        return {}
    folder = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(folder))
    out: dict[str, Callable[[str], int]] = {}
    for name in ("o200k_base", "cl100k_base"):
        try:
            enc = tiktoken.get_encoding(name)
        except Exception:  # noqa: BLE001, S112 - not cached offline: left out
            continue
        out[name] = lambda text, enc=enc: len(enc.encode_ordinary(text))
    for name in ("anthropic", "deepseek"):
        path = folder / f"{name}_tokenizer.json"
        if path.exists():
            tok = Tokenizer.from_file(str(path))
            out[name] = lambda text, tok=tok: len(tok.encode(text, add_special_tokens=False).ids)
    return out
