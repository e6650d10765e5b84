"""Word lists the seeded data and the task texts are drawn from (written for this project).

Every list is a tuple in a fixed order, so the same seed always picks the same words.
"""

from __future__ import annotations

__all__ = [
    "ADJECTIVES",
    "BRANCH_WORDS",
    "BRANDS",
    "CITIES",
    "COLORS",
    "COMMENT_OPENERS",
    "COMMIT_VERBS",
    "CREATURES",
    "FIRST_NAMES",
    "FORUMS",
    "ISSUE_AREAS",
    "ISSUE_PROBLEMS",
    "LABELS",
    "LAST_NAMES",
    "NOUNS_BY_CATEGORY",
    "PLACE_KINDS",
    "POST_SUBJECTS",
    "POST_TEMPLATES",
    "PROJECT_WORDS",
    "REVIEW_TITLES",
    "STREETS",
    "TOPIC_WORDS",
    "USER_ADJECTIVES",
]

FIRST_NAMES = (
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Mason", "Sophia", "Lucas", "Mia", "Ethan",
    "Isabella", "Logan", "Amelia", "James", "Harper", "Aiden", "Ella", "Jacob", "Grace",
    "Henry", "Chloe", "Owen", "Nora", "Caleb", "Lily", "Wyatt", "Zoe", "Jack", "Hannah",
    "Leo", "Stella", "Ryan", "Violet", "Adam", "Ruby", "Eli", "Alice", "Miles", "Clara",
    "Isaac",
)  # fmt: skip

LAST_NAMES = (
    "Lopez", "Smith", "Garcia", "Brown", "Miller", "Davis", "Wilson", "Moore", "Taylor",
    "Clark", "Hall", "Young", "King", "Wright", "Hill", "Scott", "Green", "Baker", "Adams",
    "Nelson", "Carter", "Mitchell", "Roberts", "Turner", "Phillips", "Campbell", "Parker",
    "Evans", "Edwards", "Collins", "Stewart", "Morris", "Rogers", "Reed", "Cook", "Bell",
    "Murphy", "Bailey", "Rivera", "Cooper",
)  # fmt: skip

CITIES = (
    ("Pittsburgh", "PA"), ("Columbus", "OH"), ("Denver", "CO"), ("Austin", "TX"),
    ("Portland", "OR"), ("Madison", "WI"), ("Raleigh", "NC"), ("Boise", "ID"),
    ("Tucson", "AZ"), ("Albany", "NY"), ("Richmond", "VA"), ("Omaha", "NE"),
)  # fmt: skip

STREETS = (
    "Maple Street", "Oak Avenue", "Pine Road", "Cedar Lane", "Elm Street", "Birch Way",
    "Walnut Street", "Forbes Avenue", "Liberty Avenue", "Penn Avenue", "Murray Avenue",
    "Fifth Avenue", "Baum Boulevard", "Craig Street", "Negley Avenue", "Butler Street",
)  # fmt: skip

BRANDS = (
    "Vantor", "Kelby", "Norvia", "Aldro", "Brisk", "Cortello", "Dunmore", "Everly",
    "Fenwick", "Galloway", "Hartwell", "Ironbark", "Juniper", "Kestrel", "Lumos", "Marlow",
)  # fmt: skip

ADJECTIVES = (
    "Classic", "Compact", "Deluxe", "Portable", "Premium", "Rustic", "Sleek", "Smart",
    "Sturdy", "Vintage", "Wireless", "Organic", "Ultra", "Modern", "Essential", "Pro",
)  # fmt: skip

COLORS = ("Black", "White", "Blue", "Red", "Green", "Grey", "Silver", "Brown")

# Shop categories: (name, slug) -> product nouns.
NOUNS_BY_CATEGORY: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Electronics",
        "electronics",
        ("Headphones", "Speaker", "Charger", "Keyboard", "Monitor", "Webcam"),
    ),
    (
        "Home & Kitchen",
        "home-kitchen",
        ("Kettle", "Blender", "Toaster", "Skillet", "Cutting Board", "Mug Set"),
    ),
    (
        "Beauty",
        "beauty",
        ("Face Cream", "Shampoo", "Lip Balm", "Hair Dryer", "Body Lotion", "Nail Kit"),
    ),
    (
        "Sports & Outdoors",
        "sports-outdoors",
        ("Yoga Mat", "Water Bottle", "Tent", "Backpack", "Dumbbell", "Bike Light"),
    ),
    (
        "Grocery",
        "grocery",
        ("Coffee Beans", "Green Tea", "Olive Oil", "Honey", "Granola", "Dark Chocolate"),
    ),
    (
        "Office Products",
        "office-products",
        ("Notebook", "Desk Lamp", "Stapler", "Pen Set", "Planner", "File Organizer"),
    ),
    (
        "Toys & Games",
        "toys-games",
        ("Puzzle", "Board Game", "Building Blocks", "Plush Bear", "Kite", "Card Game"),
    ),
    ("Clothing", "clothing", ("T-Shirt", "Hoodie", "Rain Jacket", "Wool Socks", "Beanie", "Scarf")),
    (
        "Garden",
        "garden",
        ("Watering Can", "Garden Hose", "Pruning Shears", "Planter", "Seed Kit", "Bird Feeder"),
    ),
    (
        "Pet Supplies",
        "pet-supplies",
        ("Dog Leash", "Cat Bed", "Pet Bowl", "Chew Toy", "Litter Box", "Pet Brush"),
    ),
)

REVIEW_TITLES = (
    "Great value", "Works as described", "Not what I expected", "Excellent quality",
    "Decent for the price", "Would buy again", "Stopped working", "Love it",
    "Average at best", "Perfect gift", "Too small", "Exceeded expectations",
)  # fmt: skip

USER_ADJECTIVES = (
    "Marvels", "Quiet", "Lucky", "Brave", "Clever", "Sunny", "Rusty", "Cosmic", "Sleepy",
    "Happy", "Grumpy", "Silver", "Swift", "Witty", "Mellow", "Bold",
)  # fmt: skip

CREATURES = (
    "Grandpa", "Otter", "Falcon", "Panda", "Walrus", "Badger", "Koala", "Raven", "Tiger",
    "Gecko", "Moose", "Heron", "Lynx", "Bison", "Marmot", "Puffin",
)  # fmt: skip

# Forums: (name, title).
FORUMS = (
    ("books", "Books"), ("movies", "Movies"), ("music", "Music"), ("gaming", "Gaming"),
    ("science", "Science"), ("technology", "Technology"), ("cooking", "Cooking"),
    ("travel", "Travel"), ("fitness", "Fitness"), ("photography", "Photography"),
    ("gardening", "Gardening"), ("history", "History"), ("space", "Space"),
    ("pittsburgh", "Pittsburgh"), ("diy", "Do It Yourself"),
    ("personalfinance", "Personal Finance"), ("programming", "Programming"), ("art", "Art"),
    ("news", "News"), ("askscience", "Ask Science"),
    ("boardgames", "Board Games"), ("cycling", "Cycling"),
)  # fmt: skip

TOPIC_WORDS = {
    "books": (
        "novel",
        "library",
        "audiobook",
        "poetry collection",
        "reading list",
        "sci-fi series",
    ),
    "movies": ("trailer", "director", "sequel", "film festival", "soundtrack", "documentary"),
    "music": ("album", "concert", "guitar riff", "playlist", "vinyl record", "jazz trio"),
    "gaming": ("speedrun", "indie game", "controller", "boss fight", "save file", "co-op mode"),
    "science": (
        "experiment",
        "microscope",
        "fossil",
        "vaccine study",
        "particle detector",
        "lab notebook",
    ),
    "technology": ("laptop", "smartphone", "router", "battery", "open source tool", "home server"),
    "cooking": (
        "sourdough",
        "cast iron pan",
        "curry recipe",
        "spice rack",
        "pasta sauce",
        "meal prep",
    ),
    "travel": ("train pass", "hostel", "road trip", "layover", "travel insurance", "packing list"),
    "fitness": (
        "running plan",
        "rest day",
        "kettlebell",
        "marathon",
        "stretching routine",
        "protein shake",
    ),
    "photography": (
        "prime lens",
        "tripod",
        "night shot",
        "film camera",
        "photo walk",
        "light meter",
    ),
    "gardening": (
        "tomato plant",
        "compost bin",
        "raised bed",
        "seedling",
        "rose bush",
        "rain barrel",
    ),
    "history": ("old map", "castle", "treaty", "museum visit", "war diary", "ancient coin"),
    "space": (
        "telescope",
        "meteor shower",
        "rocket launch",
        "moon landing",
        "comet",
        "space station",
    ),
    "pittsburgh": ("incline", "bridge", "pierogi", "bus route", "riverfront trail", "snowstorm"),
    "diy": ("workbench", "shelf bracket", "paint job", "drill bit", "wood stain", "tile project"),
    "personalfinance": (
        "budget sheet",
        "savings account",
        "credit score",
        "tax return",
        "index fund",
        "emergency fund",
    ),
    "programming": (
        "unit test",
        "linked list",
        "compiler error",
        "code review",
        "regex",
        "memory leak",
    ),
    "art": (
        "watercolor",
        "sketchbook",
        "oil painting",
        "clay sculpture",
        "ink drawing",
        "gallery show",
    ),
    "news": (
        "city council",
        "election",
        "new bridge",
        "school board",
        "local library",
        "heat wave",
    ),
    "askscience": (
        "rainbow",
        "black hole",
        "tide",
        "volcano",
        "immune system",
        "static electricity",
    ),
    "boardgames": (
        "dice tower",
        "expansion pack",
        "card sleeve",
        "game night",
        "strategy guide",
        "meeple",
    ),
    "cycling": ("road bike", "chain lube", "helmet", "bike lane", "flat tire", "gravel ride"),
}

POST_SUBJECTS = (
    "my first", "an old", "a cheap", "a broken", "a borrowed", "the best", "a weird",
    "a tiny", "a huge", "a used", "a local", "my favorite",
)  # fmt: skip

POST_TEMPLATES = (
    "What do you think of {subject} {topic}?",
    "I finally tried {subject} {topic}",
    "Any tips for {subject} {topic}?",
    "Found {subject} {topic} today",
    "Why is {subject} {topic} so popular?",
    "Review of {subject} {topic}",
    "Help with {subject} {topic}",
    "Thoughts on {subject} {topic} after a year",
)  # fmt: skip

COMMENT_OPENERS = (
    "Totally agree.", "I had the same experience.", "Interesting point.",
    "Not sure about that.", "Thanks for sharing!", "This made my day.",
    "Could you post more details?", "I disagree, respectfully.", "Great write-up.",
    "Same here.", "Where did you find it?", "Bookmarked.",
)  # fmt: skip

PROJECT_WORDS = (
    ("byteblaze", "dotfiles", "Personal configuration files"),
    ("byteblaze", "accessible-html-content-patterns", "Patterns for accessible HTML"),
    ("byteblaze", "cloud-to-butt", "A browser extension that replaces words"),
    ("a11yproject", "a11yproject.com", "The accessibility project website"),
    ("primer", "design", "Design guidelines and components"),
    ("keycloak", "keycloak-docs", "Documentation for the identity server"),
    ("kilian", "vim-config", "Editor settings and plugins"),
    ("openmap", "tile-server", "Serves map tiles from a database"),
    ("openmap", "geocoder", "Turns addresses into coordinates"),
    ("webcraft", "static-site", "A static site generator"),
    ("webcraft", "css-toolkit", "Small CSS utilities"),
    ("datalab", "csv-tools", "Command line tools for CSV files"),
    ("datalab", "plot-kit", "Plotting helpers"),
    ("meshnet", "router-firmware", "Firmware for community routers"),
    ("meshnet", "node-monitor", "Monitoring for mesh nodes"),
    ("svelte", "svelte-starter", "A starter template"),
    ("rustacean", "tiny-http", "A small HTTP server"),
    ("rustacean", "json-lint", "A JSON linter"),
)  # fmt: skip

ISSUE_AREAS = (
    "login page", "search box", "footer", "navigation bar", "settings panel", "README",
    "build script", "test suite", "dark mode", "error messages", "API client", "docs index",
    "release notes", "config parser", "install guide", "contact form",
)  # fmt: skip

ISSUE_PROBLEMS = (
    "Fix broken links in the {area}", "Improve contrast of the {area}",
    "Add tests for the {area}", "Crash when opening the {area}",
    "Update screenshots of the {area}", "Translate the {area}",
    "Refactor the {area}", "Typo in the {area}", "Slow loading of the {area}",
    "Add keyboard shortcuts to the {area}",
)  # fmt: skip

LABELS = ("bug", "feature", "documentation", "enhancement", "question", "accessibility")

COMMIT_VERBS = ("Fix", "Add", "Update", "Remove", "Refactor", "Document", "Tidy", "Rename")

BRANCH_WORDS = ("fix", "feature", "docs", "cleanup", "refactor", "update")

# Map places: kind -> name suffixes.
PLACE_KINDS = (
    ("Museum", ("Museum", "Gallery")),
    ("Library", ("Library",)),
    ("Park", ("Park", "Gardens")),
    ("Cafe", ("Cafe", "Coffee House")),
    ("Restaurant", ("Diner", "Grill", "Kitchen")),
    ("Hospital", ("Hospital", "Medical Center")),
    ("Station", ("Station",)),
    ("School", ("High School", "Academy")),
    ("Hotel", ("Hotel", "Inn")),
    ("Supermarket", ("Market", "Grocers")),
)  # fmt: skip
