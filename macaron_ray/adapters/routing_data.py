"""Routing data for L0, generated from templates and wordings, split by both.

A routing example is a user message and its canonical label. It is made from a
*template* (a sentence frame of one class and one language, with slots) and a
*wording* (the slot values plus a wrapper such as "Hey, {}"). Templates, slot
values and wrappers are each split once into train and held-out parts, and an
example draws all three from the same part: a held-out example therefore uses a
sentence frame, slot values and a wrapper that no training example uses, so
held-out accuracy measures generalization rather than memory.

Each label's examples draw a language evenly, then a frame of that language, so
every language gets the same share of the training and held-out sets.
Generation is a pure function of the seed.
"""

from __future__ import annotations

import hashlib
import random
import string
from dataclasses import dataclass
from typing import Literal

from macaron_ray.specialists.labels import LABELS

Split = Literal["train", "heldout"]

HELDOUT_PER_LABEL = 100
"""Held-out requests per label in `macaron bench routing`: one error moves a class by one point."""

# (label, language, frame). Order matters: the split is by position (see _split_of).
TEMPLATES: list[tuple[str, str, str]] = [
    # L0: chat. Small talk, feelings, opinions, advice, knowledge, stories.
    ("L0", "en", "What do you think about {topic}?"),
    ("L0", "en", "Can you explain how {topic} works?"),
    ("L0", "en", "I'm feeling {feeling} today, can we just talk for a bit?"),
    ("L0", "en", "Tell me a fun fact about {topic}."),
    ("L0", "en", "Why do people care so much about {topic}?"),
    ("L0", "en", "Give me some advice: I feel {feeling} about my job."),
    ("L0", "en", "Write a short poem about {topic}."),
    ("L0", "en", "How was your day? Mine was {feeling}."),
    ("L0", "en", "What's the difference between {topic} and {topic2}?"),
    ("L0", "en", "Tell me a bedtime story about {topic}."),
    ("L0", "en", "Is it normal to feel {feeling} on a Sunday evening?"),
    ("L0", "en", "Who invented {topic}?"),
    ("L0", "en", "Recommend a good book about {topic}."),
    ("L0", "en", "Do you have any thoughts on {topic}? Just curious."),
    ("L0", "en", "Summarize the history of {topic} in a few sentences."),
    ("L0", "en", "I'm {feeling}. Any tips to relax?"),
    ("L0", "en", "Let's chat about {topic}."),
    ("L0", "en", "What would you say is the most interesting thing about {topic}?"),
    ("L0", "en", "Can you tell me a joke about {topic}?"),
    ("L0", "en", "My friend says {topic} is overrated. Do you agree?"),
    ("L0", "es", "¿Qué opinas de {topic}?"),
    ("L0", "es", "Me siento {feeling}, ¿hablamos un rato?"),
    ("L0", "es", "Explícame qué es {topic}."),
    ("L0", "es", "Cuéntame algo curioso sobre {topic}."),
    ("L0", "es", "¿Por qué es importante {topic}?"),
    ("L0", "es", "¿Me explicas cómo funciona {topic}?"),
    ("L0", "es", "Estoy {feeling}, dame un consejo."),
    ("L0", "es", "Háblame de {topic}, tengo curiosidad."),
    ("L0", "fr", "Que penses-tu de {topic} ?"),
    ("L0", "fr", "Je me sens {feeling}, on peut discuter ?"),
    ("L0", "fr", "Explique-moi {topic} simplement."),
    ("L0", "fr", "Raconte-moi une histoire sur {topic}."),
    ("L0", "fr", "Pourquoi {topic} est-il si populaire ?"),
    ("L0", "fr", "Tu peux m'expliquer comment marche {topic} ?"),
    ("L0", "fr", "Je suis {feeling}, un conseil ?"),
    ("L0", "fr", "Parle-moi de {topic}, je suis curieux."),
    ("L0", "de", "Was hältst du von {topic}?"),
    ("L0", "de", "Ich fühle mich {feeling}, können wir reden?"),
    ("L0", "de", "Erklär mir bitte {topic}."),
    ("L0", "de", "Erzähl mir etwas Interessantes über {topic}."),
    ("L0", "de", "Warum mögen so viele Leute {topic}?"),
    ("L0", "de", "Kannst du mir erklären, wie {topic} funktioniert?"),
    ("L0", "de", "Ich bin {feeling}, hast du einen Rat?"),
    ("L0", "de", "Erzähl mir von {topic}, ich bin neugierig."),
    # L1: personal agent. Acting for the user in the world.
    ("L1", "en", "Book a table for {n} at {restaurant} at {time}."),
    ("L1", "en", "Schedule a meeting with {person} on {day} at {time}."),
    ("L1", "en", "Remind me to {errand} {when}."),
    ("L1", "en", "Send a message to {person} saying I'll be late."),
    ("L1", "en", "Order {grocery} and {grocery2} for delivery {when}."),
    ("L1", "en", "Cancel my appointment with {person} on {day}."),
    ("L1", "en", "Book me a flight to {city} on {day}."),
    ("L1", "en", "Pay my {bill} bill before {day}."),
    ("L1", "en", "Call a taxi to {place} at {time}."),
    ("L1", "en", "Add {errand} to my to-do list for {day}."),
    ("L1", "en", "Email {person} the notes from today's meeting."),
    ("L1", "en", "Find a hotel in {city} for {day} and book it."),
    ("L1", "en", "Move my {time} call with {person} to {day}."),
    ("L1", "en", "Set an alarm for {time} {when}."),
    ("L1", "en", "Reserve two tickets for the concert in {city} on {day}."),
    ("L1", "en", "Text {person} that dinner is at {time}."),
    ("L1", "en", "What's on my calendar for {day}?"),
    ("L1", "en", "Please reorder my usual {grocery} from the store."),
    ("L1", "en", "Invite {person} to lunch on {day} and put it in my calendar."),
    ("L1", "en", "Renew my library books before {day}."),
    ("L1", "en", "Message {person} that I'm on my way."),
    ("L1", "en", "Write an email to {person} saying the meeting moved to {day}."),
    ("L1", "en", "Book a doctor's appointment for {day} at {time}."),
    ("L1", "es", "Reserva una mesa para {n} en {restaurant} a las {time}."),
    ("L1", "es", "Recuérdame {errand} {when}."),
    ("L1", "es", "Envía un mensaje a {person} diciendo que llego tarde."),
    ("L1", "es", "Pide {grocery} a domicilio para {day}."),
    ("L1", "es", "Agenda una reunión con {person} el {day}."),
    ("L1", "es", "Manda un mensaje a {person}: la cena es a las {time}."),
    ("L1", "es", "Escríbele un correo a {person} con las notas de hoy."),
    ("L1", "es", "Pide un taxi a {place} a las {time}."),
    ("L1", "fr", "Réserve une table pour {n} chez {restaurant} à {time}."),
    ("L1", "fr", "Rappelle-moi de {errand} {when}."),
    ("L1", "fr", "Envoie un message à {person} pour dire que je serai en retard."),
    ("L1", "fr", "Commande {grocery} pour {day}."),
    ("L1", "fr", "Prends rendez-vous avec {person} le {day}."),
    ("L1", "fr", "Écris à {person} que le dîner est à {time}."),
    ("L1", "fr", "Envoie un e-mail à {person} avec les notes du jour."),
    ("L1", "fr", "Appelle un taxi pour {place} à {time}."),
    ("L1", "de", "Reserviere einen Tisch für {n} im {restaurant} um {time}."),
    ("L1", "de", "Erinnere mich daran, {errand} {when}."),
    ("L1", "de", "Schick {person} eine Nachricht, dass ich später komme."),
    ("L1", "de", "Bestell {grocery} für {day}."),
    ("L1", "de", "Vereinbare einen Termin mit {person} am {day}."),
    ("L1", "de", "Schreib {person}, dass das Essen um {time} ist."),
    ("L1", "de", "Schick {person} eine E-Mail mit den Notizen von heute."),
    ("L1", "de", "Bestell ein Taxi zu {place} um {time}."),
    # L2: coding. Code, shell, SQL, regex, errors.
    ("L2", "en", "Write a {plang} function that {task}."),
    ("L2", "en", "Why does my {plang} code throw {error}?"),
    ("L2", "en", "Fix this bug: {snippet}"),
    ("L2", "en", "How do I {shell} from the command line?"),
    ("L2", "en", "Write a SQL query that {sql}."),
    ("L2", "en", "Explain what this {plang} code does: {snippet}"),
    ("L2", "en", "Write unit tests in {plang} for a function that {task}."),
    ("L2", "en", "Give me a regex that matches {regex}."),
    ("L2", "en", "Refactor this {plang} loop to be faster: {snippet}"),
    ("L2", "en", "I get {error} when I run my script, what's wrong?"),
    ("L2", "en", "Implement a class in {plang} that {task}."),
    ("L2", "en", "Convert this {plang} snippet to {plang2}: {snippet}"),
    ("L2", "en", "What's the time complexity of a function that {task}?"),
    ("L2", "en", "Write a bash script that {shell_task}."),
    ("L2", "en", "My {plang} build fails with {error}. How do I fix it?"),
    ("L2", "en", "Show me how to {task_verb} in {plang}."),
    ("L2", "en", "Debug this: {snippet} gives {error}"),
    ("L2", "en", "Optimize this SQL: SELECT * FROM orders WHERE {sql_cond}"),
    ("L2", "en", "Code review my {plang} function: {snippet}"),
    ("L2", "en", "How can I {shell} with git?"),
    ("L2", "es", "Escribe una función en {plang} que {task_es}."),
    ("L2", "es", "¿Por qué mi código de {plang} da {error}?"),
    ("L2", "es", "Corrige este error: {snippet}"),
    ("L2", "es", "¿Cómo hago para {shell} en la terminal?"),
    ("L2", "es", "Escribe una consulta SQL que {sql}."),
    ("L2", "es", "Tengo un bug en mi código: {snippet}"),
    ("L2", "es", "Explica este código de {plang}: {snippet}"),
    ("L2", "es", "Mi script de {plang} falla con {error}."),
    ("L2", "fr", "Écris une fonction {plang} qui {task_fr}."),
    ("L2", "fr", "Pourquoi mon code {plang} lève {error} ?"),
    ("L2", "fr", "Corrige ce bug : {snippet}"),
    ("L2", "fr", "Comment {shell} en ligne de commande ?"),
    ("L2", "fr", "Écris une requête SQL qui {sql}."),
    ("L2", "fr", "J'ai un bug dans mon code : {snippet}"),
    ("L2", "fr", "Explique ce code {plang} : {snippet}"),
    ("L2", "fr", "Mon script {plang} plante avec {error}."),
    ("L2", "de", "Schreib eine {plang}-Funktion, die {task_de}."),
    ("L2", "de", "Warum wirft mein {plang}-Code {error}?"),
    ("L2", "de", "Behebe diesen Fehler: {snippet}"),
    ("L2", "de", "Wie kann ich im Terminal {shell}?"),
    ("L2", "de", "Schreib eine SQL-Abfrage, die {sql}."),
    ("L2", "de", "Ich habe einen Bug in meinem Code: {snippet}"),
    ("L2", "de", "Erklär diesen {plang}-Code: {snippet}"),
    ("L2", "de", "Mein {plang}-Skript stürzt mit {error} ab."),
    # L3: generative UI. Interactive components to look at and use.
    ("L3", "en", "Make an interactive chart of {data}."),
    ("L3", "en", "Build a form to {form_goal}."),
    ("L3", "en", "Create a card that shows {data}."),
    ("L3", "en", "Design a dashboard widget for {data}."),
    ("L3", "en", "Show {data} as a bar chart I can hover over."),
    ("L3", "en", "Generate a UI component with a slider for {control}."),
    ("L3", "en", "Render a table view of {data} with sortable columns."),
    ("L3", "en", "I want a little widget with buttons to {control}."),
    ("L3", "en", "Turn {data} into a pie chart card."),
    ("L3", "en", "Create a signup form with fields for {fields}."),
    ("L3", "en", "Make a countdown timer card for {event}."),
    ("L3", "en", "Build an interactive checklist UI for {event}."),
    ("L3", "en", "Visualize {data} as a line chart component."),
    ("L3", "en", "Give me a dashboard with tiles for {data}."),
    ("L3", "en", "Create a rating widget with stars for {event}."),
    ("L3", "en", "Lay out {data} as a grid of cards with images."),
    ("L3", "en", "Make a toggle panel to {control}."),
    ("L3", "en", "Draw a progress bar card for {data}."),
    ("L3", "en", "Create an input form to {form_goal} with a submit button."),
    ("L3", "en", "Build a small calendar UI card highlighting {event}."),
    ("L3", "en", "Make a feedback form UI with a text box and a send button to {form_goal}."),
    ("L3", "en", "Show {data} in a sortable table component."),
    ("L3", "en", "Build a web form component to {form_goal}."),
    ("L3", "es", "Haz un gráfico interactivo de {data}."),
    ("L3", "es", "Crea un formulario para {form_goal}."),
    ("L3", "es", "Diseña una tarjeta que muestre {data}."),
    ("L3", "es", "Crea un widget con botones para {control}."),
    ("L3", "es", "Muestra {data} en un panel con gráficos."),
    ("L3", "es", "Crea una tabla interactiva con {data}."),
    ("L3", "es", "Haz un formulario con botón de enviar para {form_goal}."),
    ("L3", "es", "Diseña un widget con un control deslizante para {control}."),
    ("L3", "fr", "Fais un graphique interactif de {data}."),
    ("L3", "fr", "Crée un formulaire pour {form_goal}."),
    ("L3", "fr", "Conçois une carte qui affiche {data}."),
    ("L3", "fr", "Crée un widget avec des boutons pour {control}."),
    ("L3", "fr", "Affiche {data} dans un tableau de bord."),
    ("L3", "fr", "Crée un tableau interactif avec {data}."),
    ("L3", "fr", "Fais un formulaire avec un bouton envoyer pour {form_goal}."),
    ("L3", "fr", "Conçois un widget avec un curseur pour {control}."),
    ("L3", "de", "Erstelle ein interaktives Diagramm von {data}."),
    ("L3", "de", "Bau ein Formular, um {form_goal}."),
    ("L3", "de", "Gestalte eine Karte, die {data} zeigt."),
    ("L3", "de", "Erstelle ein Widget mit Knöpfen, um {control}."),
    ("L3", "de", "Zeig {data} in einem Dashboard an."),
    ("L3", "de", "Erstelle eine interaktive Tabelle mit {data}."),
    ("L3", "de", "Bau ein Formular mit Absenden-Knopf, um {form_goal}."),
    ("L3", "de", "Gestalte ein Widget mit Schieberegler, um {control}."),
    # Recipe 2: more frames per group. Appended, so the frames above keep their
    # positions (and splits); one in four of these is held out like the rest.
    ("L0", "en", "Explain {topic} to me like I'm five."),
    ("L0", "en", "Describe {topic} in simple words."),
    ("L0", "en", "I've been {feeling} all week. What should I do?"),
    ("L0", "en", "Share an interesting story about {topic}."),
    ("L0", "en", "Teach me something new about {topic}."),
    ("L0", "en", "Do you think {topic} will still matter in a hundred years?"),
    ("L0", "en", "Tell me why {topic} is fascinating."),
    ("L0", "en", "I need some cheering up, I'm {feeling}."),
    ("L0", "es", "Cuéntame una historia sobre {topic}."),
    ("L0", "es", "Explícame {topic} con palabras sencillas."),
    ("L0", "es", "¿Sabes algo interesante de {topic}?"),
    ("L0", "es", "Hoy estoy {feeling}. ¿Qué me recomiendas?"),
    ("L0", "es", "Dime tu opinión sobre {topic}."),
    ("L0", "es", "Enséñame algo nuevo sobre {topic}."),
    ("L0", "es", "¿Es normal sentirse {feeling} a veces?"),
    ("L0", "es", "Descríbeme {topic} en pocas frases."),
    ("L0", "fr", "Dis-moi ce que tu sais sur {topic}."),
    ("L0", "fr", "Décris-moi {topic} en quelques phrases."),
    ("L0", "fr", "Je suis {feeling} aujourd'hui, tu peux me remonter le moral ?"),
    ("L0", "fr", "Apprends-moi quelque chose sur {topic}."),
    ("L0", "fr", "Donne-moi ton avis sur {topic}."),
    ("L0", "fr", "C'est quoi, {topic}, au juste ?"),
    ("L0", "fr", "Est-ce normal de se sentir {feeling} le dimanche soir ?"),
    ("L0", "fr", "Raconte-moi une anecdote sur {topic}."),
    ("L0", "de", "Beschreib mir {topic} in einfachen Worten."),
    ("L0", "de", "Was ist deine Meinung zu {topic}?"),
    ("L0", "de", "Ich bin heute {feeling}, muntere mich auf."),
    ("L0", "de", "Bring mir etwas über {topic} bei."),
    ("L0", "de", "Sag mir, was du über {topic} weißt."),
    ("L0", "de", "Ist es normal, sich {feeling} zu fühlen?"),
    ("L0", "de", "Erzähl mir eine Geschichte über {topic}."),
    ("L0", "de", "Was weißt du über {topic}?"),
    ("L1", "en", "Can you book a table for {n} at {restaurant} on {day}?"),
    ("L1", "en", "I need a taxi to {place} at {time}."),
    ("L1", "en", "Please text {person} and ask if {time} works."),
    ("L1", "en", "Put a reminder to {errand} on my calendar for {day}."),
    ("L1", "en", "Buy {grocery} online and have it delivered {when}."),
    ("L1", "en", "Let {person} know I can't make it on {day}."),
    ("L1", "en", "Reschedule my dentist appointment to {day}."),
    ("L1", "en", "Check me in for my flight to {city}."),
    ("L1", "es", "¿Puedes reservar un hotel en {city} para el {day}?"),
    ("L1", "es", "Cancela mi cita con {person} del {day}."),
    ("L1", "es", "Necesito un taxi a {place} a las {time}."),
    ("L1", "es", "Avísale a {person} que llego a las {time}."),
    ("L1", "es", "Compra {grocery} y {grocery2} por internet."),
    ("L1", "es", "Paga la factura de {bill} antes del {day}."),
    ("L1", "es", "Pon una alarma a las {time}."),
    ("L1", "es", "Apúntame en la agenda: {errand} {when}."),
    ("L1", "fr", "Tu peux réserver un hôtel à {city} pour {day} ?"),
    ("L1", "fr", "Annule mon rendez-vous avec {person} le {day}."),
    ("L1", "fr", "J'ai besoin d'un taxi pour {place} à {time}."),
    ("L1", "fr", "Préviens {person} que j'arrive à {time}."),
    ("L1", "fr", "Achète {grocery} et {grocery2} en ligne."),
    ("L1", "fr", "Paie ma facture de {bill} avant {day}."),
    ("L1", "fr", "Mets un réveil à {time}."),
    ("L1", "fr", "Note dans mon agenda de {errand} {when}."),
    ("L1", "de", "Kannst du ein Hotel in {city} für {day} buchen?"),
    ("L1", "de", "Sag meinen Termin mit {person} am {day} ab."),
    ("L1", "de", "Ich brauche ein Taxi zu {place} um {time}."),
    ("L1", "de", "Gib {person} Bescheid, dass ich um {time} da bin."),
    ("L1", "de", "Kauf {grocery} und {grocery2} online."),
    ("L1", "de", "Bezahl meine {bill}-Rechnung vor {day}."),
    ("L1", "de", "Stell einen Wecker auf {time}."),
    ("L1", "de", "Trag in meinen Kalender ein, {errand} {when}."),
    ("L2", "en", "Help me write a {plang} script that {task}."),
    ("L2", "en", "Can you explain this stack trace? {error} in {plang}."),
    ("L2", "en", "What's wrong with this line: {snippet}"),
    ("L2", "en", "Translate this {plang} code into {plang2}: {snippet}"),
    ("L2", "en", "Write a {plang} program that {shell_task}."),
    ("L2", "en", "How do I {task_verb} in {plang} without a library?"),
    ("L2", "en", "Give me a SQL statement that {sql}."),
    ("L2", "en", "Add type hints and docstrings to this: {snippet}"),
    ("L2", "es", "Ayúdame a escribir un script en {plang} que {task_es}."),
    ("L2", "es", "¿Qué está mal en esta línea? {snippet}"),
    ("L2", "es", "Traduce este código de {plang} a {plang2}: {snippet}"),
    ("L2", "es", "Dame una expresión regular para {regex}."),
    ("L2", "es", "Haz una consulta SQL que {sql}."),
    ("L2", "es", "Revisa mi código de {plang}: {snippet}"),
    ("L2", "es", "Escribe pruebas unitarias en {plang} para una función que {task_es}."),
    ("L2", "es", "Me sale {error} al compilar en {plang}, ¿qué hago?"),
    ("L2", "fr", "Aide-moi à écrire un script {plang} qui {task_fr}."),
    ("L2", "fr", "Qu'est-ce qui ne va pas dans cette ligne ? {snippet}"),
    ("L2", "fr", "Traduis ce code {plang} en {plang2} : {snippet}"),
    ("L2", "fr", "Donne-moi une regex pour {regex}."),
    ("L2", "fr", "Fais une requête SQL qui {sql}."),
    ("L2", "fr", "Relis mon code {plang} : {snippet}"),
    ("L2", "fr", "Écris des tests unitaires {plang} pour une fonction qui {task_fr}."),
    ("L2", "fr", "J'ai {error} à la compilation en {plang}, que faire ?"),
    ("L2", "de", "Hilf mir, ein {plang}-Skript zu schreiben, das {task_de}."),
    ("L2", "de", "Was ist an dieser Zeile falsch? {snippet}"),
    ("L2", "de", "Übersetze diesen {plang}-Code nach {plang2}: {snippet}"),
    ("L2", "de", "Gib mir eine Regex für {regex}."),
    ("L2", "de", "Mach eine SQL-Abfrage, die {sql}."),
    ("L2", "de", "Schau dir meinen {plang}-Code an: {snippet}"),
    ("L2", "de", "Schreib Unit-Tests in {plang} für eine Funktion, die {task_de}."),
    ("L2", "de", "Beim Kompilieren in {plang} bekomme ich {error}, was tun?"),
    ("L3", "en", "Put {data} in a card with a small chart."),
    ("L3", "en", "I'd like a modal dialog with a form to {form_goal}."),
    ("L3", "en", "Create a tabbed panel that shows {data}."),
    ("L3", "en", "Make a carousel of cards for {event}."),
    ("L3", "en", "Build a settings screen with switches to {control}."),
    ("L3", "en", "Display {data} as a heatmap component."),
    ("L3", "en", "Generate a stepper UI that walks me through how to {form_goal}."),
    ("L3", "en", "Design a landing page hero section for {event}."),
    ("L3", "es", "Pon {data} en una tarjeta con un gráfico pequeño."),
    ("L3", "es", "Crea una ventana modal con un formulario para {form_goal}."),
    ("L3", "es", "Haz un panel con pestañas que muestre {data}."),
    ("L3", "es", "Crea un carrusel de tarjetas para {event}."),
    ("L3", "es", "Diseña una pantalla de ajustes con interruptores para {control}."),
    ("L3", "es", "Muestra {data} como un mapa de calor."),
    ("L3", "es", "Crea una lista interactiva con casillas para {event}."),
    ("L3", "es", "Haz un componente con un botón para {control}."),
    ("L3", "fr", "Mets {data} dans une carte avec un petit graphique."),
    ("L3", "fr", "Crée une fenêtre modale avec un formulaire pour {form_goal}."),
    ("L3", "fr", "Fais un panneau à onglets qui affiche {data}."),
    ("L3", "fr", "Crée un carrousel de cartes pour {event}."),
    ("L3", "fr", "Conçois un écran de réglages avec des interrupteurs pour {control}."),
    ("L3", "fr", "Affiche {data} sous forme de carte de chaleur."),
    ("L3", "fr", "Crée une liste de cases à cocher interactive pour {event}."),
    ("L3", "fr", "Fais un composant avec un bouton pour {control}."),
    ("L3", "de", "Pack {data} in eine Karte mit einem kleinen Diagramm."),
    ("L3", "de", "Erstelle ein Modal mit einem Formular, um {form_goal}."),
    ("L3", "de", "Mach ein Panel mit Tabs, das {data} zeigt."),
    ("L3", "de", "Erstelle ein Karussell aus Karten für {event}."),
    ("L3", "de", "Gestalte einen Einstellungsbildschirm mit Schaltern, um {control}."),
    ("L3", "de", "Zeig {data} als Heatmap-Komponente."),
    ("L3", "de", "Erstelle eine interaktive Checkliste für {event}."),
    ("L3", "de", "Mach eine Komponente mit einem Knopf, um {control}."),
]

_EN_TOPICS = ["black holes", "jazz music", "the Roman empire", "coffee", "photosynthesis",
              "the moon landing", "origami", "volcanoes", "chess", "honeybees", "impressionist painting",
              "the Olympics", "dinosaurs", "tea ceremonies", "rainbows", "the printing press"]
_EN_FEELINGS = ["tired", "happy", "anxious", "bored", "excited", "lonely", "stressed", "grateful"]

# Slot pools by language ("*" for any language). Split by position (see _split_of).
SLOTS: dict[str, dict[str, list[str]]] = {
    "topic": {
        "en": _EN_TOPICS,
        "es": ["la música", "el café", "los volcanes", "la historia de Roma", "el ajedrez",
               "las abejas", "la luna", "el fútbol"],
        "fr": ["la musique", "le café", "les volcans", "la Révolution française", "les échecs",
               "les abeilles", "la lune", "le cinéma"],
        "de": ["Musik", "Kaffee", "Vulkane", "das Römische Reich", "Schach",
               "Bienen", "den Mond", "Fußball"],
    },
    "topic2": {"en": list(reversed(_EN_TOPICS))},
    "feeling": {
        "en": _EN_FEELINGS,
        "es": ["cansado", "feliz", "triste", "aburrido", "nervioso", "contento", "solo", "agotado"],
        "fr": ["fatigué", "heureux", "triste", "stressé", "seul", "content", "anxieux", "épuisé"],
        "de": ["müde", "glücklich", "traurig", "gestresst", "einsam", "froh", "nervös", "erschöpft"],
    },
    "n": {"*": ["two", "four", "3", "six", "5", "2", "8", "a party of seven"]},
    "restaurant": {"*": ["Luigi's", "the Blue Lotus", "Casa Pepe", "Sakura", "the Green Fork",
                         "Chez Marie", "Golden Dragon", "Bistro 21"]},
    "time": {"*": ["7pm", "12:30", "8 o'clock", "19:00", "noon", "6:45", "9am", "20:15"]},
    "person": {"*": ["Anna", "my boss", "Dr. Patel", "Tom", "Mom", "Lucia", "the landlord", "Kenji"]},
    "day": {"*": ["Monday", "tomorrow", "Friday", "the 14th", "next Tuesday", "Saturday",
                  "Dec 3", "Thursday"]},
    "when": {"*": ["tonight", "tomorrow morning", "in an hour", "at 5pm", "on Sunday",
                   "next week", "every Monday", "after lunch"]},
    "errand": {
        "en": ["buy milk", "call the plumber", "water the plants", "pick up the dry cleaning",
               "take my pills", "renew my passport", "feed the cat", "return the parcel"],
        "es": ["comprar leche", "llamar al fontanero", "regar las plantas", "sacar la basura",
               "tomar las pastillas", "pagar el alquiler", "dar de comer al gato", "ir al banco"],
        "fr": ["acheter du lait", "appeler le plombier", "arroser les plantes", "sortir les poubelles",
               "prendre mes médicaments", "payer le loyer", "nourrir le chat", "aller à la poste"],
        "de": ["Milch zu kaufen", "den Klempner anzurufen", "die Pflanzen zu gießen", "den Müll rauszubringen",
               "meine Tabletten zu nehmen", "die Miete zu zahlen", "die Katze zu füttern", "zur Post zu gehen"],
    },
    "grocery": {"*": ["eggs", "oat milk", "bananas", "rice", "coffee beans", "bread", "tomatoes", "pasta"]},
    "grocery2": {"*": ["butter", "apples", "cheese", "yogurt", "onions", "tea", "olive oil", "lemons"]},
    "city": {"*": ["Lisbon", "Tokyo", "Berlin", "Chicago", "Madrid", "Seoul", "Paris", "Toronto"]},
    "bill": {"*": ["electricity", "phone", "water", "internet", "gas", "credit card", "rent", "insurance"]},
    "place": {"*": ["the airport", "the station", "downtown", "the office", "the hospital",
                    "the hotel", "the stadium", "my home"]},
    "plang": {"*": ["Python", "JavaScript", "Rust", "Go", "Java", "TypeScript", "C++", "Kotlin"]},
    "plang2": {"*": ["Go", "TypeScript", "Python", "Rust", "C#", "Java", "Ruby", "Swift"]},
    "task": {"*": ["reverses a string", "checks if a number is prime", "merges two sorted lists",
                   "parses a CSV file", "counts word frequencies", "validates an email address",
                   "flattens a nested list", "computes the factorial of n"]},
    "task_es": {"*": ["invierta una cadena", "compruebe si un número es primo", "ordene una lista",
                      "lea un archivo CSV", "cuente palabras", "valide un correo",
                      "aplane una lista anidada", "calcule el factorial"]},
    "task_fr": {"*": ["inverse une chaîne", "vérifie si un nombre est premier", "trie une liste",
                      "lit un fichier CSV", "compte les mots", "valide un e-mail",
                      "aplatit une liste", "calcule la factorielle"]},
    "task_de": {"*": ["einen String umdreht", "prüft, ob eine Zahl prim ist", "eine Liste sortiert",
                      "eine CSV-Datei liest", "Wörter zählt", "eine E-Mail prüft",
                      "eine Liste abflacht", "die Fakultät berechnet"]},
    "task_verb": {"*": ["read a JSON file", "make an HTTP request", "sort a dictionary by value",
                        "spawn a thread", "handle exceptions", "write to a file",
                        "use async/await", "connect to a database"]},
    "error": {"*": ["a KeyError", "a NullPointerException", "'undefined is not a function'",
                    "a segmentation fault", "an IndexError", "a TypeError", "'borrow of moved value'",
                    "a stack overflow"]},
    "snippet": {"*": ["for i in range(len(xs)): print(xs[i+1])", "let x = arr.map(a => a * 2",
                      "if (x = 5) { return true; }", "def f(x): return x ++ 1",
                      "SELECT name FROM users WHERE age > '30", "while true do print(i) end",
                      "int[] a = new int[3]; a[3] = 1;", "fn main() { let v = vec![1]; drop(v); v.len(); }"]},
    "shell": {"*": ["find large files", "list open ports", "undo the last commit", "kill a process by name",
                    "count lines in all files", "compress a folder", "rename many files at once",
                    "check disk usage"]},
    "shell_task": {"*": ["backs up my home folder", "renames all .txt files", "monitors CPU usage",
                         "deletes logs older than 7 days", "pings a list of hosts",
                         "counts files by extension", "downloads a list of URLs", "rotates log files"]},
    "sql": {"*": ["finds the top 5 customers by revenue", "counts orders per day",
                  "joins users and orders", "finds duplicate emails", "computes a running total",
                  "lists products never ordered", "gets the second highest salary",
                  "groups sales by region"]},
    "sql_cond": {"*": ["status = 'open'", "created_at > NOW() - INTERVAL 7 DAY", "customer_id IN (1,2,3)",
                       "total > 100", "region LIKE 'EU%'", "paid = false", "YEAR(created_at) = 2026",
                       "items > 3"]},
    "regex": {"*": ["email addresses", "US phone numbers", "dates like 2026-12-01", "hex colors",
                    "IPv4 addresses", "URLs", "postal codes", "words in all caps"]},
    "data": {
        "en": ["my monthly expenses", "the weekly weather forecast", "my running distances",
               "sales by region", "my sleep hours this month", "team tasks by status",
               "my reading list progress", "stock prices this week"],
        "es": ["mis gastos del mes", "el tiempo de la semana", "las ventas por región",
               "mis horas de sueño", "mis kilómetros corridos", "las tareas del equipo",
               "mis lecturas", "los precios de la semana"],
        "fr": ["mes dépenses du mois", "la météo de la semaine", "les ventes par région",
               "mes heures de sommeil", "mes kilomètres courus", "les tâches de l'équipe",
               "mes lectures", "les prix de la semaine"],
        "de": ["meine monatlichen Ausgaben", "das Wetter der Woche", "die Umsätze nach Region",
               "meine Schlafstunden", "meine Laufkilometer", "die Aufgaben des Teams",
               "meine Leseliste", "die Preise dieser Woche"],
    },
    "form_goal": {
        "en": ["collect event RSVPs", "report a bug", "book a yoga class", "submit an expense",
               "sign up for the newsletter", "request time off", "rate our service", "order a custom cake"],
        "es": ["confirmar asistencia", "reportar un error", "reservar una clase", "enviar un gasto",
               "suscribirse al boletín", "pedir vacaciones", "valorar el servicio", "pedir una tarta"],
        "fr": ["confirmer sa présence", "signaler un bug", "réserver un cours", "déclarer une dépense",
               "s'inscrire à la newsletter", "demander un congé", "noter le service", "commander un gâteau"],
        "de": ["Zusagen zu sammeln", "einen Fehler zu melden", "einen Kurs zu buchen", "Ausgaben einzureichen",
               "den Newsletter zu abonnieren", "Urlaub zu beantragen", "den Service zu bewerten",
               "eine Torte zu bestellen"],
    },
    "control": {
        "en": ["adjust the thermostat", "pick a playlist volume", "set the brightness",
               "choose a pizza size", "filter products by price", "switch light and dark mode",
               "set a budget limit", "choose the number of guests"],
        "es": ["ajustar el volumen", "elegir el tamaño", "cambiar el brillo", "filtrar por precio",
               "cambiar el tema", "elegir invitados", "fijar un presupuesto", "elegir color"],
        "fr": ["régler le volume", "choisir la taille", "changer la luminosité", "filtrer par prix",
               "changer de thème", "choisir les invités", "fixer un budget", "choisir la couleur"],
        "de": ["die Lautstärke einzustellen", "die Größe zu wählen", "die Helligkeit zu ändern",
               "nach Preis zu filtern", "das Thema zu wechseln", "Gäste auszuwählen",
               "ein Budget festzulegen", "die Farbe zu wählen"],
    },
    "fields": {"*": ["name and email", "username, password and birthday", "company and role",
                     "phone number and address", "email and interests", "name, age and city",
                     "team name and size", "email and country"]},
    "event": {"*": ["my birthday party", "the product launch", "our wedding", "the marathon",
                    "the school trip", "New Year's Eve", "the team offsite", "the exam week"]},
}

# Wrappers put a wording around a filled frame. Split by position (see _split_of).
WRAPPERS: dict[str, list[str]] = {
    "en": ["{}", "Hey, {}", "{} Thanks!", "Quick one: {}", "Could you help? {}", "{} please",
           "hi! {}", "So, {}", "I need this: {}",
           "Hello! {}", "{} Thank you.", "Okay so {}", "Good morning. {}", "{} Cheers", "Right, {}"],
    "es": ["{}", "Hola, {}", "{} ¡Gracias!", "Una pregunta: {}", "Oye, {}", "{} por favor",
           "Buenas, {}", "Necesito esto: {}", "Bueno, {}",
           "¡Hola! {}", "{} Muchas gracias.", "A ver, {}", "Buenos días. {}", "{} Gracias", "Mira, {}"],
    "fr": ["{}", "Salut, {}", "{} Merci !", "Petite question : {}", "Dis, {}", "{} s'il te plaît",
           "Bonjour, {}", "J'ai besoin de ça : {}", "Alors, {}",
           "Coucou ! {}", "{} Merci beaucoup.", "Bon, {}", "Bonjour à toi. {}", "{} Merci", "Écoute, {}"],
    "de": ["{}", "Hallo, {}", "{} Danke!", "Kurze Frage: {}", "Hey, {}", "{} bitte",
           "Moin, {}", "Ich brauche das: {}", "Also, {}",
           "Servus! {}", "{} Vielen Dank.", "Okay, {}", "Guten Morgen. {}", "{} Danke", "Sag mal, {}"],
}


@dataclass(frozen=True)
class RouteExample:
    text: str
    label: str
    lang: str
    split: Split
    template_id: str
    wording_id: str
    """The slot values and wrapper this example was worded with."""


def _split_of(index: int, period: int) -> Split:
    """Every `period`-th item (counting from the second-last of each group) is held out."""
    return "heldout" if index % period == period - 2 else "train"


def template_split(index_in_group: int) -> Split:
    """A template's split, by its position within its (label, language) group."""
    return _split_of(index_in_group, 4)


def slot_values(slot: str, lang: str, split: Split) -> list[str]:
    pool = SLOTS[slot].get(lang) or SLOTS[slot].get("*") or SLOTS[slot]["en"]
    return [v for i, v in enumerate(pool) if _split_of(i, 3) == split]


def wrappers(lang: str, split: Split) -> list[str]:
    # The bare "{}" comes first, so it is always a training wrapper.
    return [w for i, w in enumerate(WRAPPERS[lang]) if _split_of(i, 3) == split]


def template_groups() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(label, lang) -> [(template_id, frame)] in file order."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for label, lang, frame in TEMPLATES:
        group = groups.setdefault((label, lang), [])
        group.append((f"{label}-{lang}-{len(group):02d}", frame))
    return groups


def _slots_in(frame: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(frame) if name]


def generate(split: Split, per_label: int, seed: int) -> list[RouteExample]:
    """`per_label` distinct examples per label from `split`'s templates and wordings."""
    rng = random.Random(f"{seed}:{split}")
    out: list[RouteExample] = []
    groups = template_groups()
    for label in LABELS:
        # Languages are drawn evenly, then a frame of that language: English has
        # more frames than the others and would otherwise crowd them out.
        frames: dict[str, list[tuple[str, str]]] = {}
        for (lab, lang), group in groups.items():
            if lab == label:
                frames[lang] = [(tid, frame) for i, (tid, frame) in enumerate(group)
                                if template_split(i) == split]
        langs = sorted(frames)
        seen: set[str] = set()
        attempts = 0
        while len([e for e in out if e.label == label]) < per_label:
            attempts += 1
            if attempts > per_label * 200:
                raise ValueError(f"cannot make {per_label} distinct {split} examples for {label}")
            lang = langs[rng.randrange(len(langs))]
            tid, frame = frames[lang][rng.randrange(len(frames[lang]))]
            values = {s: rng.choice(slot_values(s, lang, split)) for s in _slots_in(frame)}
            wrapper = rng.choice(wrappers(lang, split))
            text = wrapper.format(frame.format(**values))
            if text in seen:
                continue
            seen.add(text)
            wording = "|".join(f"{k}={v}" for k, v in sorted(values.items())) + f"|wrap={wrapper}"
            out.append(RouteExample(
                text=text, label=label, lang=lang, split=split, template_id=tid,
                wording_id=hashlib.sha256(wording.encode()).hexdigest()[:16],
            ))
    rng.shuffle(out)
    return out

