"""Dequantization kernels: GGUF blocks -> float32, bit-exact with gguf-py's `gguf.quants.dequantize`.

Each kernel is `deq_<type>(w, rows, out)`: w [N, row_bytes] uint8 (or [N, K] float32 / uint16 for the float
types), rows int64 [R] (the weight rows wanted, in order), out float32 [R, K]. Whole tensors pass
rows = arange(N); the token-embedding gather passes the token ids.

Exactness: the arithmetic is gguf-py's, operation for operation, in float32 with no FMA contraction
(e.g. Q4_1 is `d * q + m`, two roundings; Q4_K is `(d * sc) * q - (dmin * m)`). Byte layouts: see
ggufrun.quants.registry.
"""

from __future__ import annotations

import base64

import numpy as np
from numba import njit

from .jit import EXACT

# kvalues_iq4nl (llama.cpp ggml-common.h)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


@njit(inline="always", **EXACT)
def f16(w, r, o):
    """The IEEE half at bytes o, o+1 of row r, as float32 (exact, subnormals and inf/nan included)."""
    h = np.int32(w[r, o]) | (np.int32(w[r, o + 1]) << 8)
    e = h & 0x7C00
    if e == 0:
        f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
    elif e == 0x7C00:
        f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
    else:
        f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
    return -f if h & 0x8000 else f


@njit(**EXACT)
def deq_q4_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 18):
            o = b * 18
            d = f16(w, r, o)
            for j in range(16):
                v = np.int32(w[r, o + 2 + j])
                out[i, b * 32 + j] = d * np.float32((v & 15) - 8)
                out[i, b * 32 + 16 + j] = d * np.float32((v >> 4) - 8)


@njit(**EXACT)
def deq_q4_1(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 20):
            o = b * 20
            d = f16(w, r, o)
            mn = f16(w, r, o + 2)
            for j in range(16):
                v = np.int32(w[r, o + 4 + j])
                out[i, b * 32 + j] = d * np.float32(v & 15) + mn
                out[i, b * 32 + 16 + j] = d * np.float32(v >> 4) + mn


@njit(**EXACT)
def deq_q5_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 22):
            o = b * 22
            d = f16(w, r, o)
            qh = (
                np.int64(w[r, o + 2])
                | (np.int64(w[r, o + 3]) << 8)
                | (np.int64(w[r, o + 4]) << 16)
                | (np.int64(w[r, o + 5]) << 24)
            )
            for j in range(16):
                v = np.int32(w[r, o + 6 + j])
                lo = (v & 15) | np.int32(((qh >> j) & 1) << 4)
                hi = (v >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                out[i, b * 32 + j] = d * np.float32(lo - 16)
                out[i, b * 32 + 16 + j] = d * np.float32(hi - 16)


@njit(**EXACT)
def deq_q5_1(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 24):
            o = b * 24
            d = f16(w, r, o)
            mn = f16(w, r, o + 2)
            qh = (
                np.int64(w[r, o + 4])
                | (np.int64(w[r, o + 5]) << 8)
                | (np.int64(w[r, o + 6]) << 16)
                | (np.int64(w[r, o + 7]) << 24)
            )
            for j in range(16):
                v = np.int32(w[r, o + 8 + j])
                lo = (v & 15) | np.int32(((qh >> j) & 1) << 4)
                hi = (v >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                out[i, b * 32 + j] = d * np.float32(lo) + mn
                out[i, b * 32 + 16 + j] = d * np.float32(hi) + mn


@njit(**EXACT)
def deq_q8_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 34):
            o = b * 34
            d = f16(w, r, o)
            for j in range(32):
                out[i, b * 32 + j] = np.float32(np.int8(w[r, o + 2 + j])) * d


@njit(**EXACT)
def deq_iq4_nl(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 18):
            o = b * 18
            d = f16(w, r, o)
            for j in range(16):
                v = w[r, o + 2 + j]
                out[i, b * 32 + j] = d * IQ4_VALUES[v & 15]
                out[i, b * 32 + 16 + j] = d * IQ4_VALUES[v >> 4]


@njit(**EXACT)
def deq_q2_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 84):
            o = b * 84
            d = f16(w, r, o + 80)
            dmin = f16(w, r, o + 82)
            for g in range(8):  # 32-value groups: bits 2(g%4) of qs[32*(g//4):]
                for half in range(2):
                    sc = np.int32(w[r, o + 2 * g + half])
                    dl = d * np.float32(sc & 0xF)
                    ml = dmin * np.float32(sc >> 4)
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int32(w[r, o + 16 + 32 * (g // 4) + l]) >> (2 * (g % 4))) & 3
                        out[i, b * 256 + 32 * g + l] = dl * np.float32(q) - ml


@njit(inline="always", **EXACT)
def _k3_scale(w, r, o, j):
    low = np.int32(w[r, o + j]) & 0xF if j < 8 else np.int32(w[r, o + j - 8]) >> 4
    high = (np.int32(w[r, o + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


@njit(**EXACT)
def deq_q3_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 110):
            o = b * 110
            d = f16(w, r, o + 108)
            for g in range(8):
                for half in range(2):
                    dl = d * np.float32(_k3_scale(w, r, o + 96, 2 * g + half))
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int32(w[r, o + 32 + 32 * (g // 4) + l]) >> (2 * (g % 4))) & 3
                        if not (np.int32(w[r, o + l]) >> g) & 1:
                            q -= 4
                        out[i, b * 256 + 32 * g + l] = dl * np.float32(q)


@njit(inline="always", **EXACT)
def _k4_scale_min(w, r, o, g):
    """(scale, min) of sub-block g from the 12 packed bytes at o (get_scale_min_k4 in ggml-quants.c)."""
    if g < 4:
        return np.int32(w[r, o + g]) & 63, np.int32(w[r, o + g + 4]) & 63
    sc = (np.int32(w[r, o + g + 4]) & 0xF) | ((np.int32(w[r, o + g - 4]) >> 6) << 4)
    mn = (np.int32(w[r, o + g + 4]) >> 4) | ((np.int32(w[r, o + g]) >> 6) << 4)
    return sc, mn


@njit(**EXACT)
def deq_q4_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 144):
            o = b * 144
            d = f16(w, r, o)
            dmin = f16(w, r, o + 2)
            for g in range(8):
                sc, mn = _k4_scale_min(w, r, o + 4, g)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(mn)
                shift = 4 * (g % 2)
                for l in range(32):
                    q = (np.int32(w[r, o + 16 + 32 * (g // 2) + l]) >> shift) & 0xF
                    out[i, b * 256 + 32 * g + l] = dl * np.float32(q) - ml


@njit(**EXACT)
def deq_q5_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 176):
            o = b * 176
            d = f16(w, r, o)
            dmin = f16(w, r, o + 2)
            for g in range(8):
                sc, mn = _k4_scale_min(w, r, o + 4, g)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(mn)
                shift = 4 * (g % 2)
                for l in range(32):
                    q = (np.int32(w[r, o + 48 + 32 * (g // 2) + l]) >> shift) & 0xF
                    q |= ((np.int32(w[r, o + 16 + l]) >> g) & 1) << 4
                    out[i, b * 256 + 32 * g + l] = dl * np.float32(q) - ml


@njit(**EXACT)
def deq_q6_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 210):
            o = b * 210
            d = f16(w, r, o + 208)
            for h in range(2):
                for k in range(4):
                    for half in range(2):
                        sc = np.int32(np.int8(w[r, o + 192 + 8 * h + 2 * k + half]))
                        dl = d * np.float32(sc)
                        for l in range(16 * half, 16 * half + 16):
                            ql = np.int32(w[r, o + 64 * h + 32 * (k % 2) + l])
                            ql = ql & 0xF if k < 2 else ql >> 4
                            qh = (np.int32(w[r, o + 128 + 32 * h + l]) >> (2 * k)) & 3
                            out[i, b * 256 + 128 * h + 32 * k + l] = dl * np.float32((ql | (qh << 4)) - 32)


@njit(**EXACT)
def deq_iq4_xs(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 136):
            o = b * 136
            d = f16(w, r, o)
            sh = np.int32(w[r, o + 2]) | (np.int32(w[r, o + 3]) << 8)
            for g in range(8):
                ls = ((np.int32(w[r, o + 4 + g // 2]) >> (4 * (g % 2))) & 0xF) | (((sh >> (2 * g)) & 3) << 4)
                dl = d * np.float32(ls - 32)
                for j in range(16):
                    v = w[r, o + 8 + 16 * g + j]
                    out[i, b * 256 + 32 * g + j] = dl * IQ4_VALUES[v & 15]
                    out[i, b * 256 + 32 * g + 16 + j] = dl * IQ4_VALUES[v >> 4]


@njit(**EXACT)
def deq_f32(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(w.shape[1]):
            out[i, k] = w[r, k]


@njit(**EXACT)
def deq_f16(w, rows, out):
    # w: uint16 bits of IEEE halves
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(w.shape[1]):
            h = np.int32(w[r, k])
            e = h & 0x7C00
            if e == 0:
                f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
            elif e == 0x7C00:
                f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
            else:
                f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
            out[i, k] = -f if h & 0x8000 else f


@njit(**EXACT)
def deq_bf16(w, rows, out):
    # w: uint16, the high halves of float32
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(w.shape[1]):
            out[i, k] = np.uint32(np.int64(w[r, k]) << 16).view(np.float32)


# ---- IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: a grid code book entry per 8 (IQ2) or 4 (IQ3) values, plus sign bits
# (dequantize_row_iq2_xxs .. dequantize_row_iq3_s in llama.cpp ggml-quants.c). The code books are the tables of
# ggml-common.h (iq2xxs_grid, iq2xs_grid, iq2s_grid: bytes 0x08, 0x19, 0x2b; iq3xxs_grid: 0x04 .. 0x3e; iq3s_grid:
# 1, 3, .., 15), written as one 16-bit word (4 hex digits) per entry: value j is level number (word >> bits * j).
# dot.py holds the same tables (Numba's cache keys a kernel on its own file: kernels must not read another file's).

# fmt: off
IQ2XXS_HEX = (  # iq2xxs_grid, 256 entries
    "0000000200050008000a00110014002000220028002a00410044005000580061006400800082008a00a20101010401100115014001840198"
    "020002020222028204010404041004210424044004420448046004810484049004a405000502050805200546056905800591060906100640"
    "068406a40800080508080814082808410844085008520888090409400a020a14100110041010102110401060108410901095110011081120"
    "1150115a1180122412451400140814201425144914801518156216001616180118041810184018811900190519a01a5120002002200a2044"
    "20612080208221292148220022022401240424102440245625002541256426902808282028942a4440014004401040184021402440404048"
    "4056406040814084409041004120416141804185420142104248425642684400440844204480449945124524460048014804481048404845"
    "49004958496149824a454a9050005008501150195020508050885104514251a4529154905492550a56015654580058115819586459405a08"
    "6004601060406068610061556218626064006405651065126584684280008002800a80418082810481188140821184018404841084158440"
    "8460850085468594860986408660880289048a11900490109024904090a1911691809245940094229444955198819920a002a050a085a109"
    "a200a418a850a904"
)
IQ2XS_HEX = (  # iq2xs_grid, 512 entries
    "0000000200050008000a00110014001600190020002200250028004100440046004900500052005500580061006400800082008500880091"
    "0094009900a001010104010601090110011201150118011a0121012401400142014501480151015401600168018101840190020002020205"
    "020802110214022002410244025002550280028a040104040406040904100412041504180421042404400442044504480451045404560460"
    "04810484049005000502050505080511051405200541054405500561058006010604061006260640064206840800080208050808080a0811"
    "0814082008250841084408500858088008a008aa0901090409100940098109890a000a200a280a960aa01001100410061009101010121015"
    "1018102110241040104210451048105110541060106a10811084109011001102110511081111111411201141114411501180119411961201"
    "1204120612101240126014001402140514081411141414201441144414491450146414801501150415101540160016141649180118041810"
    "18121840185418861900190519661a511aa92000200220052008200a201120142020204120442050208020a0210121042110214021482165"
    "22002222228022a82401240424102429244025002541255225992601261a26a628002808280a28202855288828a2296829902a082a202a82"
    "2a882a8a40014004400640094010401240154018402140244040404240454048404a40514054406040654081408440904100410241054108"
    "4111411441204141414441504180418541a24201420442104212422942404400440244054408441144144419442044414444445044804494"
    "45014504451045244540459a4600460a464446504801480448104840484548544862490049114944495049694a0450005002500550085011"
    "50145020502850415044505050805101510451105115514051425200524452aa540154045410542154405460548154a15500550855805588"
    "5621566856a158005814584158505899591a594059425a85600160046010604060546062608660a961006224624a62926400641665106540"
    "654565a46801686a69256a066a546a628000800280058008801180148020802a8041804480508080808280a880aa81018104810681108140"
    "81518159820082208280828282a082a8840184048410841284158440846084898500854485a58618866a880088088825885a8880888288a8"
    "89068a228a808a888a968aa890019004901090409056908491009122916492569289940094059444945094589529959095929641985198a6"
    "99499a159a60a000a002a008a00aa020a02aa0a0a151a159a1a6a200a202a208a22aa280a2a0a440a495a665a698a80aa820a822a828a8a0"
    "a8a8a904a984a986aa28aa2aaa91aaaa"
)
IQ2S_HEX = (  # iq2s_grid, 1024 entries
    "0000000200050008000a00110014001600190020002200250028004100440046004900500052005500580061006400660069008000820085"
    "00880091009400a000a500aa0101010401060109011001120115011801210124014001420145014801510154015601590160016501680181"
    "018401900192019501a101a40200020202050208021102140220022a02410244024602490250025502800285028a029402a2040104040406"
    "0409041004120415041804210424042604290440044204450448044a04510454045604590460046204650481048404860489049004950498"
    "04a104a40500050205050508050a051105140516051905200525052805410544054605490550055205550558056105640580058205850588"
    "0591059405a00601060406060609061006150640064506480651065406600681068406900800080208050808081108140816081908200825"
    "082a084108440846084908500852085508580861086408800885089408aa0901090409100912091509180921094009450948095109540960"
    "098109900a000a110a140a220a280a2a0a500a99100110041006100910101012101510181021102410261040104210451048105110541056"
    "1059106010621065106810811084108610901095109810a110a41100110211051108110a1111111411161119112011221125112811411144"
    "1146114911501152115511581161116411801182118511881191119412011204120912101215122112241240124512511254128112841290"
    "14001402140514081411141414161419142014251428144114441446144914501452145514581461146414801482148514881491149414a0"
    "1501150415061509151015121515151815211524154015421545154815511554156015811584159016001605160816111614162016411644"
    "1650168016aa1801180418061809181018151818182118401842184518481851185418601881188419001902190519081911191419201941"
    "19441950196919a21a041a101a401a562000200220052008201120142016201920202025202a2041204420502052205520642080208a2094"
    "20aa2101210421102112211521212140214221452151215421602181218421902200220a22222228222a224422502288228a22a824012404"
    "2406240924102415241824212424244024422445244824512454246024812484249025002505250825112514252025412544255025662580"
    "260126042610264026592800280528112814284128442850288a28aa29012904291029952a0a2a222a642a882a8a40014004400640094010"
    "401240154018401a4021402440264040404240454048404a40514054405640594060406240654081408440904095409840a140a441004102"
    "410541084111411441164119412041224125414141444146414941504152415541584161416441804182418541884191419441a042014204"
    "42104212421542184224424042454248425142544260428142844400440244054408440a4411441444164419442044224425442844414444"
    "4446444944504452445544584461446444804482448544884491449444a04501450445064509451045124515451845214524454045424545"
    "4548455145544560456a4581458445904600460246054608461146144620464146444650468046a548014804480948104812481548184821"
    "48244840484248454848485148544860488448904900490249054908491149144920494149444950498049964a014a044a104a4050005002"
    "5005500850115014501650195020502250255028504150445046504950505052505550585061506450805082508550885091509451015104"
    "5106510951105112511551185121512451405142514551485151515451605181518451905200520552085211521452205241524452505269"
    "5280540154045406540954105412541554185421542454405442544554485451545454605481548454905500550255055508551155145520"
    "5541554455505580560156045610562656405800580258055808581158145820584158445850585a588059015904591059405a005a195a85"
    "5aa8600160046006601060126015601860216024604060456048605160546060608460906100610261056108611161146120614161446150"
    "61806199620462106240625662a164006405640864116414642064416444645064806501650465106540654a656865926600669468016804"
    "6810686568986900692a6a426aa1800080028005800880118014801980208025804180448050805280558058806180808085809180948101"
    "8104810981108112811581188121812481408142814581488151815481818184819081a982008205820a8211821482418244825084018404"
    "8406840984108412841584188421844084428445844884518454846084818484849085008502850585088511851485208541854485508580"
    "858a86018604861086298640880088058811881488418844885088a289018904894089658a228a588a5a8a828aa290019004900990109012"
    "90159018902490409042904590489051905490609081908490909100910591119114914191449150915a920192049210924092a694009402"
    "94059408941194149420944194449450948094969501950495109540959895a19600964696649801980498109826984098a9990099499952"
    "9a90a000a005a00aa014a022a02aa041a044a050a0a2a0aaa140a165a202a20aa222a228a22aa282a288a28aa2a8a401a404a410a440a489"
    "a4a4a500a519a651a80aa828a8a2a954a986aa08aa0aaa20aa22aa28aa88aaaa"
)
IQ3XXS_HEX = (  # iq3xxs_grid, 256 entries
    "0000000200040011001300170020002200310042007300750101010301100112012101250130013201410154017002000202020402110220"
    "0222023102330237025102570275030103070310031203250370041304370444045704730475050105070532055206350664071007140716"
    "0743076110011003101010121021102310301032103410471050110011021111112011221201120312101212122112301272130013021320"
    "1331134613661401140514501520152415461571160517221740200020022011201320202022202620312042210121032105211021122121"
    "2130216321672170220022022211221722202222223722402255230123102314237023742435245325032527254125742701270327162745"
    "3001301030123021302330503065307231003102312031313144314632013203321032253252327233113333343034473472350035063522"
    "3555361436363663373337604004401740354037405340574174422042374240426042664307434544044451446445254543457047054710"
    "4712473050125041507051005106512651555214523252725302535354105423542754725502553156505724574260246044604660646121"
    "6161621762646330633664446505655266336703672170037005700770107032705271267140721272457252730073157333736074217441"
    "7500750275247630"
)
IQ3S_HEX = (  # iq3s_grid, 512 entries
    "0000000100020005000700100011001200140016002000210025003300400042004500470051005300600062007100740077010001010102"
    "0104011001110115012001230127013101350144016101650172020002010205020702100213021602210225023002340242024502470251"
    "0253027002730303031103150320032203310333033603440350035203670371037504000413041704210424043204400443045104700502"
    "0504052005220526053305410545054705660573060606110613063106520671070007020704072007220726073307500754100010011002"
    "1004101010111013101510171020102210311034103610541056106110721100110111031106111011141121113011331141115011521170"
    "1176120012121215121712201224123212401243125512601272130113041307131013131321132713301334134113621370140314051412"
    "1414143114331442144614501454150115101513152115301532155116201624162716441646170117031710171217211735174117621770"
    "2000200120032005200720102012201420162021202320272030203220412043204520502052206720702073207521002102211021132117"
    "2122212521312134214221512201220422072221222322302237224122532257227122742300230223052311232223242331233323422350"
    "2366240124072420242324322435244124722475250425112522253725402553257026002602260726212655266127052711272627302743"
    "2750300230113013301530173022303130333035304230443047305130633071310131033105311431213123314031603172317632003212"
    "3220323232343250330133103314332133233327333033413343334733553373340334113416342234313452346034643501351035123525"
    "3532354435563573361636413701370337203722373540004004401240204024402740324041405040704102410741114113412241304135"
    "4143415141554201420342104215422142334240425742624270430443114313432043224331433544004402442444374440447145054507"
    "4521456246134634466047104715473047434751500250105014502250405044504750525066507451015103510551125121513251725200"
    "5211522352305236525353025307531053275344535153655373540154045420543254465512552655515553564257025704572260116013"
    "6015603160336060610061206127616462126234624262556262627063006314632163406425644364626500650365346560660566406711"
    "6713700070047007702070227036704070547062710271117124714371457201720472107216722172307251730273327335735374017405"
    "74137420745075227542760276317700"
)
# fmt: on


def _code_book(words: str, n_values: int, bits: int, levels) -> np.ndarray:
    """The packed table -> uint8 [entries, n_values] of grid values."""
    w = np.array([int(words[k : k + 4], 16) for k in range(0, len(words), 4)], np.int64)
    return np.array(levels, np.uint8)[(w[:, None] >> (bits * np.arange(n_values))) & ((1 << bits) - 1)]


IQ2_LEVELS = (0x08, 0x19, 0x2B)
IQ2XXS_GRID = _code_book("".join(IQ2XXS_HEX), 8, 2, IQ2_LEVELS)  # [256, 8]
IQ2XS_GRID = _code_book("".join(IQ2XS_HEX), 8, 2, IQ2_LEVELS)  # [512, 8]
IQ2S_GRID = _code_book("".join(IQ2S_HEX), 8, 2, IQ2_LEVELS)  # [1024, 8]
IQ3XXS_GRID = _code_book("".join(IQ3XXS_HEX), 4, 4, (0x04, 0x0C, 0x14, 0x1C, 0x24, 0x2C, 0x34, 0x3E))  # [256, 4]
IQ3S_GRID = _code_book("".join(IQ3S_HEX), 4, 4, range(1, 16, 2))  # [512, 4]
# ksigns_iq2xs: a 7-bit sign index plus an 8th sign bit that makes the count of negative values even
KSIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], np.uint8)


@njit(inline="always", **EXACT)
def _u32(w, r, o):
    return (
        np.int64(w[r, o]) | (np.int64(w[r, o + 1]) << 8) | (np.int64(w[r, o + 2]) << 16) | (np.int64(w[r, o + 3]) << 24)
    )


@njit(inline="always", **EXACT)
def _signed(v, signs, j):
    """v, negated where bit j of `signs` is set (db * grid * (+-1) in gguf-py: exact either way)."""
    return -v if (signs >> j) & 1 else v


@njit(**EXACT)
def deq_iq2_xxs(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 66):
            o = b * 66
            d = f16(w, r, o)
            for g in range(8):  # 32 values: 4 grid indices (bytes), then 4 x 7 sign bits and a 4-bit scale
                q = o + 2 + 8 * g
                aux = _u32(w, r, q + 4)
                db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25)
                for l in range(4):
                    signs = np.int32(KSIGNS[(aux >> (7 * l)) & 127])
                    k = w[r, q + l]
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 8 * l + j] = _signed(db * np.float32(IQ2XXS_GRID[k, j]), signs, j)


@njit(**EXACT)
def deq_iq2_xs(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 74):
            o = b * 74
            d = f16(w, r, o)
            for g in range(8):  # 32 values: 4 uint16 (9-bit grid index, 7-bit sign index), two 4-bit scales
                sc = np.int32(w[r, o + 66 + g])
                for l in range(4):
                    db = d * (np.float32(0.5) + np.float32((sc >> (4 * (l // 2))) & 15)) * np.float32(0.25)
                    q = np.int32(w[r, o + 2 + 8 * g + 2 * l]) | (np.int32(w[r, o + 3 + 8 * g + 2 * l]) << 8)
                    signs = np.int32(KSIGNS[q >> 9])
                    for j in range(8):
                        v = db * np.float32(IQ2XS_GRID[q & 511, j])
                        out[i, b * 256 + 32 * g + 8 * l + j] = _signed(v, signs, j)


@njit(**EXACT)
def deq_iq2_s(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 82):
            o = b * 82
            d = f16(w, r, o)
            for g in range(8):  # 32 values: qs[4g:4g+4] + 2 bits each of qh[g] index the grid, signs[4g:4g+4]
                sc = np.int32(w[r, o + 74 + g])
                qh = np.int32(w[r, o + 66 + g])
                for l in range(4):
                    db = d * (np.float32(0.5) + np.float32((sc >> (4 * (l // 2))) & 15)) * np.float32(0.25)
                    k = np.int32(w[r, o + 2 + 4 * g + l]) | (((qh >> (2 * l)) & 3) << 8)
                    signs = np.int32(w[r, o + 34 + 4 * g + l])
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 8 * l + j] = _signed(db * np.float32(IQ2S_GRID[k, j]), signs, j)


@njit(**EXACT)
def deq_iq3_xxs(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 98):
            o = b * 98
            d = f16(w, r, o)
            for g in range(8):  # 32 values: qs[8g:8g+8] index the grid, a uint32 of 4 x 7 sign bits + 4-bit scale
                aux = _u32(w, r, o + 66 + 4 * g)
                db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
                for l in range(4):
                    signs = np.int32(KSIGNS[(aux >> (7 * l)) & 127])
                    k1, k2 = w[r, o + 2 + 8 * g + 2 * l], w[r, o + 3 + 8 * g + 2 * l]
                    for j in range(4):
                        v1 = db * np.float32(IQ3XXS_GRID[k1, j])
                        v2 = db * np.float32(IQ3XXS_GRID[k2, j])
                        out[i, b * 256 + 32 * g + 8 * l + j] = _signed(v1, signs, j)
                        out[i, b * 256 + 32 * g + 8 * l + 4 + j] = _signed(v2, signs, j + 4)


@njit(**EXACT)
def deq_iq3_s(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 110):
            o = b * 110
            d = f16(w, r, o)
            for g in range(8):  # 32 values: qs[8g:8g+8] + bit k of qh[g] index the grid, signs[4g:4g+4]
                db = d * np.float32(1 + 2 * ((np.int32(w[r, o + 106 + g // 2]) >> (4 * (g % 2))) & 15))
                qh = np.int32(w[r, o + 66 + g])
                for k in range(8):
                    e = np.int32(w[r, o + 2 + 8 * g + k]) | (((qh >> k) & 1) << 8)
                    signs = np.int32(w[r, o + 74 + 4 * g + k // 2])
                    for j in range(4):
                        v = db * np.float32(IQ3S_GRID[e, j])
                        out[i, b * 256 + 32 * g + 4 * k + j] = _signed(v, signs, 4 * (k % 2) + j)


# ---- IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4 --------------------------------------------------------------------
# iq1s_grid (llama.cpp ggml-common.h): 2048 entries of 8 values in {-1, 0, 1}, here packed 2 bits per value
# (value + 1 at bits 2j of a little-endian uint16 per entry, base64). dot.py holds the same literal (the kernels'
# helpers and constants live in the kernels' own file); tests/test_quants_iq1tq.py checks the two are equal and
# spot-checks entries against llama.cpp's table.
IQ1S_GRID_PACKED = (
    "AAACAAUACAAKABEAFQAgACIAKAAqAEUAUQBUAFYAZQCAAIIAiACKAJUAoACiAKgAqgAEAQUBEQEUARYBGQEaASUBQQFGAUkBUgFVAVoBYQFk"
    "AWYBaAGFAZEBlAGWAaUBAAICAggCCgIVAiACIgIoAioCRQJRAlkCZAJpAoACggKIAooCkQKVApkCoAKiAqgCqgIRBBQEFgQlBEEESQRVBFoE"
    "ZARlBJEEmQSlBAEFBAUFBQYFFQUYBRoFKQVABUUFSgVQBVEFVAVVBVYFWQVgBWIFZQVoBWoFgQWRBZUFmAWaBaEFpAWlBaYFqQUUBhkGQQZE"
    "BlAGUgZVBlgGYAZhBmYGaQaFBpEGlAaZBgAIAggICAoIFQggCCIIKAgqCEUIUQhWCGUIgAiCCIgIigiVCKAIogioCKoIBQkRCRQJGQkkCSUJ"
    "QQlQCVEJVQlhCWQJaQmRCZQJlgmZCaUJAAoCCggKCgoVCiAKIgooCioKRQpRClkKYQplCoAKggqFCogKigqVCqAKogqoCqoKEBAREBQQGRAk"
    "ECUQQRBEEFAQVRBYEGEQZBBlEGkQkRCUEJYQoRClEAERBBEGEQkREBESERURGBEhESQRKRFFEUoRUBFREVIRVBFVEVYRWRFgEWURhBGSEZUR"
    "oRGkERESFBIWEiUSQBJGEkkSUhJVElgSWhJkEmYShRKREpQSlhKlEgEUBhQJFBQUFRQYFBkUIRQmFEEURRRGFEgUShRRFFQUVRRWFFkUYhRl"
    "FGgUhBSJFJAUlBSVFJgUmRSaFKEUpBSlFKkUAhUFFQoVERUUFRUVFhUZFSAVIhUlFSgVKhVBFUQVRRVGFVEVUhVUFVUVVhVZFVoVYRVkFWUV"
    "ZhVpFYAVghWEFYUViBWKFZAVkRWUFZUVlhWZFZoVoBWiFaUVARYEFgUWBhYVFhYWGBYaFiEWJhZAFkIWRBZFFkgWShZRFlUWVhZYFlkWYRZk"
    "FmUWaBZpFmoWhhaKFpIWlRakFqkWERgWGCUYQRhEGEYYSRhQGFUYWBhaGGAYYRhkGGYYaRiFGJEYlBilGBAZEhkVGRoZIRklGUIZRBlFGUgZ"
    "URlUGVUZVhlZGVoZYBllGWoZiRmRGZIZlRmYGaEZphmpGQkaFhokGiYaRBpGGkkaUBpSGlUaWBphGmYaaRqFGpEalhqaGgAgAiAIIAogFSAg"
    "ICIgJSAoICogRSBRIFkgYSBlIIAggiCIIIoglSCgIKIgpSCoIKogBSERIRQhGSElIUIhRCFJIVUhWCFaIWEhZCFlIWYhhSGQIZYhmSGlIQEi"
    "CCIKIhEiFSIgIiIiKCIqIkUiUSJWIlkiZSKBIogiiiKRIpUioCKiIqgiqiIFJBQkFiQZJCUkRCRFJEYkSSRSJFUkWCRaJGYkhSSRJJQkmSSh"
    "JKUkCSUVJSElKSVAJUUlSCVRJVQlVSVZJWIlZSVoJYklkCWUJZUlmCWaJaElpCWmJaklBSYQJhImGSYlJkEmSSZVJmAmYSZpJoQmhiaQJpom"
    "ACgCKAgoCigVKCAoIigoKCooRShRKFQoZSiAKIIoiCiKKKAooiioKKooCSkRKRQpGSklKUYpSSlSKVUpYSlkKWYpaSmFKZAplimZKaQppSkA"
    "KgIqCCoKKiAqIiooKioqRSpRKlYqWSplKoAqgiqIKooqlSqgKqIqqCqqKgVAEUAWQCVASUBSQFVAWEBaQGFAZEBmQJRAmUChQKZAAEEBQQRB"
    "BkEJQRJBFUEWQRhBGkEhQSZBKUFFQUhBSkFRQVRBVUFWQVlBWkFlQWhBakGBQYRBhkGQQZJBlUGgQaFBokEFQhFCFEIWQiVCQUJSQlVCWkJk"
    "QmlCiUKUQqVCAUQVRBlEKURFREhESkRRRFREVURWRGFEYkRlRGhEakSBRIZEiUSQRJJElUSgRKFEqUQBRQJFBUUKRRFFFEUVRRZFGUUgRSVF"
    "KkVBRURFRUVGRUlFUEVRRVRFVUVWRVhFWUVhRWRFZUVmRWlFgkWERYVFiEWRRZRFlUWWRZlFmkWlRahFqkUBRgVGCUYURhVGGEYaRiFGJEYp"
    "RkBGQkZFRkhGUEZRRlJGVUZWRllGYkZlRmhGgUaFRopGlEaVRqFGpEamRgVIEUgVSBpIJUhCSElIUEhVSFhIYUhkSGZIaUiFSJFIlEiWSJlI"
    "pUgBSQVJBkkKSRBJFEkVSRhJIUkkSSZJQElFSUpJUUlSSVRJVUlWSVlJYEliSWVJZklqSYZJiUmSSZVJlkmYSaFJpEmmSalJFkpESkZKSUpV"
    "SlhKWkpkSmlKlEqlSgFQBFAFUAZQCVASUBVQGlAhUCRQKVBAUEVQSFBRUFRQVVBWUFlQZVBoUIZQiVCVUJhQoFChUKZQqVAFUQhRCVEKURFR"
    "FFEVURZRGFEZUSBRJVEmUShRKlFBUURRRVFGUUlRUFFRUVJRVFFVUVZRWFFZUVpRYVFkUWVRZlFpUYJRhVGRUZRRlVGWUZlRoFGlUapRAVIG"
    "UhJSFVIaUiFSJFJCUkVSSlJRUlRSVVJWUllSYlJlUoVSkFKSUpVSmVKaUqRSBFQFVBFUFFQVVBZUGFQZVCFUJVQoVCpUQVREVEVURlRJVEpU"
    "UFRRVFRUVVRWVFhUWVRaVGFUYlRkVGVUZlRpVIBUiFSKVJFUlFSVVJZUmVShVKRUpVSqVAFVAlUEVQVVBlUJVRBVEVUSVRRVFVUWVRlVGlUh"
    "VSRVJVUmVSlVQFVBVUJVRFVFVUZVSFVJVVBVUVVSVVRVVVVWVVhVWVVaVWBVYVVkVWVVZlVoVWlValWBVYRVhVWJVYpVkFWRVZRVlVWWVZhV"
    "mVWhVaRVpVWmValVAFYBVgJWBFYGVghWCVYRVhRWFVYYVhlWIFYhViJWJFYlViZWKFYpVkFWRVZGVkhWSVZKVlBWUVZSVlRWVVZWVlhWWVZa"
    "VmFWZFZlVmlWglaFVoZWiFaJVopWkVaVVppWolalVqZWqFapVgRYBVgGWAlYEFgVWBhYIVgqWEVYSFhKWFFYVFhVWFZYWFhZWGBYYlhkWGVY"
    "gliJWJBYkliVWJhYoVipWAFZAlkFWQpZEVkUWRVZFlkZWSVZQVlEWUVZRllJWVBZUVlSWVRZVVlWWVhZWVlaWWFZZFllWWZZaVmBWYVZiVmR"
    "WZRZlVmWWZhZmVmlWQRaCFoVWhpaIFolWiZaKVpFWkhaSVpRWlVaVlpYWllaYlplWmhaalqBWopaklqVWpZamFqaWqFaBWAUYBZgGWAlYERg"
    "UGBVYFZgWGBaYGFgZGBmYGlggWCWYKVgAWEEYQZhCWESYRVhIWEiYSZhKWFFYUlhUWFVYVZhWWFlYWZhamGEYYphkmGVYaFhpmGpYRFiFmIZ"
    "YkBiQWJGYlViVmJYYmBihWKRYpZipWIRZBJkFWQWZBpkIWQmZClkQGRCZEVkSGRKZFFkVGRVZFZkWWRaZGBkYmRlZIRkhWSJZJBkkmSUZJVk"
    "lmSYZJpkoWSkZKlkBWUIZQplEWUVZRZlGWVEZUVlRmVJZVBlUWVUZVVlVmVZZWFlZGVlZWZlaWWGZYllimWRZZVllmWZZZplomWlZaZlqGUC"
    "ZglmFWYgZiZmKGYpZkBmRWZIZkpmUWZUZlVmVmZYZlpmYGZlZmhmgGaCZoVmimaUZpZmmGaZZqBmpGamZqpmFmgZaCVoQWhSaFVoWmhhaGlo"
    "hWiRaJhopmgBaQRpEGkVaSFpJGkmaSlpQGlBaUVpRmlIaVFpVGlVaVZpWWlgaWVpammCaYRpimmVaaFppGmlaalpEWoWahhqQWpEaklqUGpV"
    "alhqWmpkamVqaWqGapRqmGqaaqZqAIACgAiACoAggCKAKIAqgEWAUIBRgFSAVoBZgGWAgICCgIiAioCVgKCAooCogKqABYERgRSBFoEZgSWB"
    "QYFEgUmBUIFSgVWBVoFYgVmBZIFmgWmBhYGJgZSBloGZgaWBAIICggiCCoIVgiCCIoIogiqCUYJUglmCZYKAgoKCiIKKgpWCoIKigqiCqoIU"
    "hBmEQYREhFGEVYRahGGEZIRphJSEmYQBhQmFEoUVhRqFJoUphUCFQYVFhUiFUYVUhVWFVoVZhVqFZYVmhWiFaoWBhYSFhoWJhZCFkoWVhZiF"
    "poURhhaGGYYlhkGGRIZJhkqGUIZVhlmGWoZhhmaGaoaFhpGGmoakhgCIAogIiAqIFYggiCKIKIgqiEGIRYhRiFSIWYhliGmIgIiCiIiIioiV"
    "iKCIooioiKqIBYkGiRGJFIkWiSWJQYlEiUaJSYlQiVKJVYlaiWGJZImFiZaJmYmliQCKAooIigqKFYogiiKKKIoqikWKUYpUilaKgIqCioiK"
    "ioqViqCKooqoiqqKBZARkBaQGJAZkCWQQZBGkEmQVZBYkFqQaZBqkIWQkZCUkJaQmZClkAGRBJEGkQmREJEVkRiRGpEhkSSRJpEpkUCRRZFQ"
    "kVGRVJFVkVaRWZFikWWRhJGGkZKRlZGYkaGRpJGmkamRBZIRkhSSGZIlkkSSRpJJklCSUpJVkliSZpJpkoWSlJKWkqmSAZQElAaUEJQVlBiU"
    "JpRAlEqUUZRUlFWUVpRYlFmUYJRhlGKUZZSElIaUkpSUlJWUmJShlKmUAJUFlQiVCpUQlRGVFJUVlRaVGZUhlSWVKZUqlUGVRJVFlUaVSZVQ"
    "lVGVUpVUlVWVVpVYlVmVWpVhlWSVZZVmlWmVgZWFlYiVkZWSlZSVlZWWlZmVmpWglaKVpZWolaqVAZYElhCWFZYZliCWJpYplkWWSJZJllGW"
    "UpZVllaWWZZllmiWgpaElomWipaSlpSWlZaklqaWqZYFmBaYGZglmEGYRphQmFKYVZhWmFqYZJhlmIWYkZiWmJmYpZgEmQaZCZkQmRKZFZkY"
    "mRqZIJkhmSSZJplAmUKZRZlImUqZUZlUmVWZVplZmWKZZZlmmWqZgZmEmZCZkpmVmZqZoZmmmQWaFZolmkSaRppJmlCaVZpYmmGahZqRmpSa"
    "lZqWmgCgAqAIoAqgFaAgoCKgKKAqoEWgUaBUoFagWaCAoIKgiKCKoJWgoKCioKigqqAFoQmhEaEUoRahGaEaoUahSaFRoVWhWKFaoWGhZKGF"
    "oZChkqGWoZmhAqIIogqiEKIZoiKiKKIqokWiUaJWolmiZaKAooKiiKKKopWioKKioqiiqqIZpCWkQaREpFCkVKRVpFikWqRhpGWkZqRopGmk"
    "haQGpQmlEKUSpRWlGKUmpSmlQqVFpVGlVKVVpValWaVlpWqlgaWEpYWlhqWJpZKllaWYpQWmEaYWphqmIaYlpkSmRqZKplKmVaZWplimYKZi"
    "poamkKaVppammaahpqSmpqYAqAKoCKgKqCCoIqgoqCqoUahUqFaoWaiAqIKoiKiKqJWooKiiqKioqqgFqRSpGakhqSWpQalQqVWpWqlhqWap"
    "aamQqZapAKoCqgiqCqogqiKqKKoqqlGqVKpWqoCqgqqIqoqqlaqgqqKqqKqqqg=="
)


def _unpack_iq1s_grid(packed: str) -> np.ndarray:
    """IQ1S_GRID_PACKED -> int8 [2048, 8], the values of iq1s_grid."""
    entries = np.frombuffer(base64.b64decode("".join(packed)), "<u2").astype(np.int32)
    return (((entries[:, None] >> (2 * np.arange(8))) & 3) - 1).astype(np.int8)


IQ1S_GRID = _unpack_iq1s_grid(IQ1S_GRID_PACKED)
_IQ1S_GRID_F32 = IQ1S_GRID.astype(np.float32)
IQ1_DELTA = np.float32(0.125)  # IQ1S_DELTA / IQ1M_DELTA
# kvalues_mxfp4 (llama.cpp ggml-common.h): E2M1 values, doubled (the scale is halved to match)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


@njit(inline="always", **EXACT)
def _f16_bits(h):
    """IEEE half bits h (0..0xFFFF) -> float32, exactly as f16()."""
    e = h & 0x7C00
    if e == 0:
        f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
    elif e == 0x7C00:
        f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
    else:
        f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
    return -f if h & 0x8000 else f


@njit(inline="always", **EXACT)
def iq1m_d(w, r, o):
    """IQ1_M's fp16 scale: the top nibbles of the four uint16 scale words at o (iq1m_scale_t in llama.cpp)."""
    h = (np.int32(w[r, o + 1]) >> 4) | (np.int32(w[r, o + 3]) & 0xF0)
    h |= ((np.int32(w[r, o + 5]) >> 4) << 8) | ((np.int32(w[r, o + 7]) & 0xF0) << 8)
    return _f16_bits(h)


@njit(inline="always", **EXACT)
def e8m0_half(e):
    """GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32 (subnormal for e < 2; never inf or NaN)."""
    if e < 2:
        return np.uint32(0x00200000 << e).view(np.float32)
    return np.uint32(np.int64(e - 1) << 23).view(np.float32)


@njit(**EXACT)
def deq_iq1_s(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 50):
            o = b * 50
            d = f16(w, r, o)
            for g in range(8):
                qh = np.int32(w[r, o + 34 + 2 * g]) | (np.int32(w[r, o + 35 + 2 * g]) << 8)
                dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
                delta = -IQ1_DELTA if qh & 0x8000 else IQ1_DELTA
                for l in range(4):
                    idx = np.int32(w[r, o + 2 + 4 * g + l]) | (((qh >> (3 * l)) & 7) << 8)
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 8 * l + j] = dl * (_IQ1S_GRID_F32[idx, j] + delta)


@njit(**EXACT)
def deq_iq1_m(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 56):
            o = b * 56
            d = iq1m_d(w, r, o + 48)
            for g in range(8):
                sc = np.int32(w[r, o + 48 + 2 * (g // 2)]) | (np.int32(w[r, o + 49 + 2 * (g // 2)]) << 8)
                for l in range(4):
                    qh = np.int32(w[r, o + 32 + 2 * g + l // 2]) >> (4 * (l % 2))
                    idx = np.int32(w[r, o + 4 * g + l]) | ((qh & 7) << 8)
                    dl = d * np.float32(2 * ((sc >> (6 * (g % 2) + 3 * (l // 2))) & 7) + 1)
                    delta = -IQ1_DELTA if qh & 8 else IQ1_DELTA
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 8 * l + j] = dl * (_IQ1S_GRID_F32[idx, j] + delta)


@njit(inline="always", **EXACT)
def _trit(v, p):
    """Digit of the byte v selected by the power of three p: ((v * p mod 256) * 3) >> 8, in 0..2."""
    return (((np.int32(v) * p) & 0xFF) * 3) >> 8


@njit(**EXACT)
def deq_tq1_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 54):
            o = b * 54
            d = f16(w, r, o + 52)
            y = b * 256
            p = 1
            for n in range(5):  # qs[0:32]: values 32n + m
                for m in range(32):
                    out[i, y + 32 * n + m] = np.float32(_trit(w[r, o + m], p) - 1) * d
                p *= 3
            p = 1
            for n in range(5):  # qs[32:48]: values 160 + 16n + m
                for m in range(16):
                    out[i, y + 160 + 16 * n + m] = np.float32(_trit(w[r, o + 32 + m], p) - 1) * d
                p *= 3
            p = 1
            for n in range(4):  # qh[0:4]: values 240 + 4n + j
                for j in range(4):
                    out[i, y + 240 + 4 * n + j] = np.float32(_trit(w[r, o + 48 + j], p) - 1) * d
                p *= 3


@njit(**EXACT)
def deq_tq2_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 66):
            o = b * 66
            d = f16(w, r, o + 64)
            for g in range(8):  # bits 2(g%4) of qs[32*(g//4):]
                for m in range(32):
                    q = (np.int32(w[r, o + 32 * (g // 4) + m]) >> (2 * (g % 4))) & 3
                    out[i, b * 256 + 32 * g + m] = np.float32(q - 1) * d


@njit(**EXACT)
def deq_mxfp4(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 17):
            o = b * 17
            d = e8m0_half(np.int32(w[r, o]))
            for j in range(16):
                v = w[r, o + 1 + j]
                out[i, b * 32 + j] = MXFP4_VALUES[v & 15] * d
                out[i, b * 32 + 16 + j] = MXFP4_VALUES[v >> 4] * d
